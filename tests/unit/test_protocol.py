"""WebSocket protocol v1 core: parser, serialiser and rate limiter, without sockets or models."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voice import events as ev
from voice.errors import ProtocolError
from web import protocol as p
from web.protocol import LimitExceeded
from web.ratelimit import RateLimit, TokenBucket, Verdict

LIMITS = p.ProtocolLimits(max_message_bytes=1024, max_text_chars=50)


# --- parser: valid messages ------------------------------------------------------------------------------------------
def test_parses_hello_text_interrupt_and_audio() -> None:
    assert p.parse_client_message('{"type":"hello","sample_rate":48000}', LIMITS) == p.Hello(48000)
    assert p.parse_client_message('{"type":"hello","sample_rate":16000.0,"protocol":1}', LIMITS) == p.Hello(16000)
    assert p.parse_client_message('{"type":"hello"}', LIMITS) == p.Hello(16000)
    assert p.parse_client_message('{"type":"text","text":"  what time is it? "}', LIMITS) == p.TextTurn(
        "what time is it?"
    )
    assert p.parse_client_message('{"type":"interrupt"}', LIMITS) == p.Interrupt()
    frame = p.parse_client_message(b"\x01\x00\xff\x7f", LIMITS)
    assert frame == p.AudioFrame(b"\x01\x00\xff\x7f")
    assert isinstance(frame, p.AudioFrame) and frame.samples == 2


def test_accepts_frames_exactly_at_the_limits() -> None:
    assert isinstance(p.parse_client_message(b"\x00" * 1024, LIMITS), p.AudioFrame)
    text = "x" * 50
    assert p.parse_client_message(json.dumps({"type": "text", "text": text}), LIMITS) == p.TextTurn(text)


# --- parser: every kind of bad input, with a message that says what is wrong ------------------------------------------
@pytest.mark.parametrize(
    ("data", "error", "fragment"),
    [
        ("{", ProtocolError, "invalid JSON"),
        ("", ProtocolError, "invalid JSON"),
        ("[1,2]", ProtocolError, "must be a JSON object, got an array"),
        ('"hello"', ProtocolError, "got a string"),
        ('{"text":"hi"}', ProtocolError, 'field "type"'),
        ('{"type":5}', ProtocolError, 'field "type"'),
        ('{"type":"dance"}', ProtocolError, "unknown message type 'dance'"),
        ('{"type":"text"}', ProtocolError, '"text" must be a string, got null'),
        ('{"type":"text","text":42}', ProtocolError, "got a number"),
        ('{"type":"text","text":"   "}', ProtocolError, "empty"),
        ('{"type":"text","text":"a\\u0000b"}', ProtocolError, "control characters"),
        ('{"type":"text","text":"a\\ud800b"}', ProtocolError, "surrogates"),
        ('{"type":"text","text":"hi","voice":"x"}', ProtocolError, "unknown field(s) for 'text': 'voice'"),
        ('{"type":"interrupt","now":true}', ProtocolError, "unknown field"),
        ('{"type":"hello","sample_rate":100}', ProtocolError, "outside 8000..96000"),
        ('{"type":"hello","sample_rate":192000}', ProtocolError, "outside"),
        ('{"type":"hello","sample_rate":"16000"}', ProtocolError, "must be an integer, got a string"),
        ('{"type":"hello","sample_rate":16000.5}', ProtocolError, "must be an integer"),
        ('{"type":"hello","sample_rate":true}', ProtocolError, "must be an integer, got a boolean"),
        ('{"type":"hello","protocol":2}', ProtocolError, "unsupported protocol 2"),
        (b"", ProtocolError, "empty audio frame"),
        (b"\x00\x01\x02", ProtocolError, "odd length"),
        (b'{"type":"text","text":"hi"}', ProtocolError, "must be sent as text frames"),
        (b"\x00" * 1026, LimitExceeded, "exceeds the limit of 1024 bytes"),
        ('{"type":"text","text":"' + "é" * 600 + '"}', LimitExceeded, "bytes exceeds the limit"),
        ('{"type":"text","text":"' + "x" * 51 + '"}', LimitExceeded, "51 characters exceeds the limit of 50"),
    ],
)
def test_rejects_bad_input_with_a_clear_message(data: str | bytes, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error) as info:
        p.parse_client_message(data, LIMITS)
    assert fragment in str(info.value)
    assert info.value.code == ("limit_exceeded" if error is LimitExceeded else "protocol_error")


def test_deeply_nested_json_is_a_protocol_error_not_a_recursion_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ProtocolError):
        p.parse_client_message(deep, p.ProtocolLimits(max_message_bytes=1_000_000))


def test_error_messages_quote_hostile_values_safely() -> None:
    with pytest.raises(ProtocolError) as info:
        p.parse_client_message(json.dumps({"type": "\ud800" + "x" * 500}), LIMITS)
    message = str(info.value)
    assert len(message) < 200
    message.encode("utf-8")  # a lone surrogate would make the error itself unsendable


# --- parser fuzzing: nothing but ProtocolError, ever ------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
messages_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["hello", "text", "interrupt", "x", ""]) | st.text(max_size=8)},
    optional={"sample_rate": json_values, "text": json_values, "protocol": json_values, "extra": json_values},
)


@settings(max_examples=400, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=2048),
        st.text(max_size=300),
        json_values.map(json.dumps),
        messages_like.map(json.dumps),
    )
)
def test_fuzz_parser_raises_only_protocol_errors(data: str | bytes) -> None:
    try:
        message = p.parse_client_message(data, LIMITS)
    except ProtocolError as exc:
        assert str(exc)
        str(exc).encode("utf-8")
        return
    assert isinstance(message, p.Hello | p.TextTurn | p.Interrupt | p.AudioFrame)
    if isinstance(message, p.AudioFrame):
        assert len(message.pcm) % 2 == 0 and 0 < len(message.pcm) <= LIMITS.max_message_bytes
    if isinstance(message, p.TextTurn):
        assert message.text.strip() and len(message.text) <= LIMITS.max_text_chars
    if isinstance(message, p.Hello):
        assert p.MIN_INPUT_SAMPLE_RATE <= message.sample_rate <= p.MAX_INPUT_SAMPLE_RATE


# --- serialiser ---
def _decoded(event: ev.Event) -> dict[str, object]:
    frame = p.encode_event(event)
    assert isinstance(frame, str)
    return json.loads(frame)


def test_ready_names_the_protocol_version_session_and_rates() -> None:
    ready = json.loads(p.ready_message("abc", 22050, 16000, LIMITS))
    assert ready == {
        "type": "ready",
        "protocol": 1,
        "session": "abc",
        "sample_rate": 22050,
        "input_sample_rate": 16000,
        "max_message_bytes": 1024,
        "max_text_chars": 50,
        "echo_cancellation": "client",
    }
    assert json.loads(p.ready_message("abc", 22050, 16000, LIMITS, "server"))["echo_cancellation"] == "server"


def test_hello_asks_who_cancels_the_echo_and_refuses_anything_else() -> None:
    hello = '{"type":"hello","sample_rate":16000,"echo_cancellation":"server"}'
    assert p.parse_client_message(hello, LIMITS) == p.Hello(16000, echo_cancellation="server")
    assert p.parse_client_message('{"type":"hello","echo_cancellation":"client"}', LIMITS).echo_cancellation == "client"
    for bad in ('"browser"', "true", '"SERVER"', "1"):
        with pytest.raises(ProtocolError, match="echo_cancellation"):
            p.parse_client_message(f'{{"type":"hello","echo_cancellation":{bad}}}', LIMITS)


def test_serialises_each_client_visible_event() -> None:
    s = "sess"
    assert _decoded(ev.SpeechStart(session=s, turn=1)) == {"type": "vad", "turn": 1, "state": "speech_start"}
    end = _decoded(ev.SpeechEnd(session=s, turn=1, t_ns=1_000_000_000, detected_ns=1_250_000_000))
    assert end == {"type": "vad", "turn": 1, "state": "speech_end", "endpoint_ms": 250.0}
    transcript = _decoded(ev.Transcript(session=s, turn=1, text="hello there", committed="hello", final=False))
    assert transcript == {"type": "transcript", "turn": 1, "text": "hello there", "committed": "hello", "final": False}
    draft = _decoded(
        ev.DraftUpdate(
            session=s, turn=1, step=3, committed="Hi", draft="Hi you", pieces=(("Hi", True), (" you", False))
        )
    )
    assert draft["pieces"] == [["Hi", True], [" you", False]]
    assert (draft["type"], draft["step"], draft["committed"], draft["draft"]) == ("draft", 3, "Hi", "Hi you")
    answer = _decoded(
        ev.AnswerDone(session=s, turn=1, text="Hi you", tokens=3, passes=2, lm_seconds=0.25, finish_reason="stop")
    )
    assert answer["type"] == "answer" and answer["text"] == "Hi you" and answer["passes"] == 2
    assert _decoded(ev.AudioStart(session=s, turn=1, sample_rate=22050)) == {
        "type": "audio_start",
        "turn": 1,
        "sample_rate": 22050,
    }
    assert _decoded(ev.AudioEnd(session=s, turn=1)) == {"type": "audio_end", "turn": 1}
    assert _decoded(ev.Clear(session=s, turn=1, reason="barge_in")) == {
        "type": "clear",
        "turn": 1,
        "reason": "barge_in",
    }
    assert _decoded(ev.Pause(session=s, turn=1)) == {"type": "pause", "turn": 1}
    assert _decoded(ev.Resume(session=s, turn=1)) == {"type": "resume", "turn": 1}
    assert _decoded(ev.ErrorEvent(session=s, turn=2, code="asr_failed", message="boom")) == {
        "type": "error",
        "code": "asr_failed",
        "message": "boom",
        "turn": 2,
    }


def test_audio_is_binary_and_internal_events_are_not_sent() -> None:
    pcm = b"\x01\x02" * 10
    assert p.encode_event(ev.AudioOut(session="s", turn=1, pcm=pcm, sample_rate=22050, phrase_id=0)) == pcm
    assert p.encode_event(ev.LmFirstPass(session="s", turn=1)) is None
    assert p.encode_event(ev.PhraseCommitted(session="s", turn=1, phrase_id=0, text="Hi.")) is None


def test_text_frame_is_the_json_of_events_that_have_one_and_refuses_the_rest() -> None:
    clear = ev.Clear(session="s", turn=3, reason="barge_in")
    assert p.text_frame(clear) == p.encode_event(clear)
    assert json.loads(p.text_frame(ev.AudioEnd(session="s", turn=3))) == {"type": "audio_end", "turn": 3}
    with pytest.raises(TypeError, match="AudioOut"):
        p.text_frame(ev.AudioOut(session="s", turn=1, pcm=b"\x00\x00", sample_rate=22050, phrase_id=0))
    with pytest.raises(TypeError, match="LmFirstPass"):
        p.text_frame(ev.LmFirstPass(session="s", turn=1))


def test_turn_end_carries_latencies_and_never_emits_invalid_json() -> None:
    end = ev.TurnEnd(
        session="s",
        turn=4,
        user_text="hi",
        answer="hello",
        spoken="hello",
        interrupted=False,
        latency_ms={"voice_to_voice": 812.3456, "asr_final": math.nan, "tts_first_chunk": math.inf},
        stats={"tokens_per_pass": 1.23456},
    )
    frame = p.encode_event(end)
    assert isinstance(frame, str) and "NaN" not in frame and "Infinity" not in frame
    decoded = json.loads(frame)
    assert decoded["latency_ms"] == {"voice_to_voice": 812.3, "asr_final": None, "tts_first_chunk": None}
    assert decoded["stats"] == {"tokens_per_pass": 1.2346}
    assert decoded["type"] == "turn_end" and decoded["interrupted"] is False


# --- rate limiter ---
def test_bucket_accepts_real_time_forever() -> None:
    bucket = TokenBucket(RateLimit(rate=1.5, burst=3.0, close_after=10.0), now=0.0)
    verdicts = {bucket.take(0.02, now=i * 0.02).verdict for i in range(50 * 600)}  # ten minutes of 20 ms frames
    assert verdicts == {Verdict.ACCEPT}
    assert bucket.dropped == 0


def test_bucket_allows_a_burst_then_drops_with_one_notice_per_interval_then_closes() -> None:
    bucket = TokenBucket(RateLimit(rate=1.0, burst=3.0, close_after=2.0, notify_interval_s=1.0), now=0.0)
    decisions = [bucket.take(0.5, now=0.0) for _ in range(6)]  # 3 s of audio at once: the whole burst
    assert all(d.verdict is Verdict.ACCEPT for d in decisions)
    first_drop = bucket.take(0.5, now=0.0)
    assert first_drop.verdict is Verdict.DROP and first_drop.notify
    second_drop = bucket.take(0.5, now=0.1)
    assert second_drop.verdict is Verdict.DROP and not second_drop.notify
    assert bucket.take(0.5, now=0.6).verdict is Verdict.ACCEPT  # refilled 0.6 s
    third = bucket.take(1.0, now=1.2)  # 0.7 s in the bucket
    assert third.verdict is Verdict.DROP and third.notify  # a second notice after the interval
    assert bucket.dropped == 2.0
    assert bucket.take(1.0, now=1.2).verdict is Verdict.CLOSE  # 3 s dropped > close_after


def test_bucket_refill_is_capped_at_the_burst_and_ignores_a_clock_going_backwards() -> None:
    bucket = TokenBucket(RateLimit(rate=1.0, burst=1.0, close_after=100.0), now=0.0)
    assert bucket.take(1.0, now=1000.0).verdict is Verdict.ACCEPT
    assert bucket.take(0.5, now=1000.0).verdict is Verdict.DROP
    assert bucket.take(0.5, now=999.0).verdict is Verdict.DROP


def test_rate_limit_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="positive"):
        RateLimit(rate=0.0, burst=1.0, close_after=1.0)


def test_played_reports_parse_and_bad_ones_are_protocol_errors() -> None:
    from web.protocol import Played

    limits = p.ProtocolLimits()
    assert p.parse_client_message('{"type": "played", "turn": 3, "samples": 44100}', limits) == Played(3, 44100)
    for bad in ('{"type": "played", "turn": 3}', '{"type": "played", "turn": -1, "samples": 5}',
                '{"type": "played", "turn": 3, "samples": true}', '{"type": "played", "turn": 3, "samples": 1.5}',
                '{"type": "played", "turn": 3, "samples": 5, "extra": 1}'):
        with pytest.raises(ProtocolError):
            p.parse_client_message(bad, limits)
