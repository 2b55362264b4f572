"""The Realtime protocol core without sockets: audio codecs, client-event parsing, and the translator driven by
scripted session events (the event names and shapes checked against the official `openai` client's types)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import TypeAdapter

from voice import events as ev
from web.realtime.actions import (
    EndAudio,
    FeedAudio,
    Interrupt,
    Send,
    SendText,
    SetInstructions,
    TruncateHeard,
)
from web.realtime.audio import PCM16_24K, PCMA, PCMU, OutputEncoder, from_pcm16, to_pcm16
from web.realtime.client_events import (
    AppendAudio,
    CreateUserText,
    RealtimeError,
    SessionSettings,
    SessionUpdate,
    parse_client_event,
)
from web.realtime.translator import RealtimeTranslator

SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
S = "sess1"


def parse(event: dict) -> object:
    return parse_client_event(json.dumps(event), SessionSettings(), 2000)


def sent(actions: list) -> list[dict]:
    """The server events among `actions`, each validated against the official client's types."""
    events = [a.event for a in actions if isinstance(a, Send)]
    for event in events:
        SERVER_EVENT.validate_python(event)
    return events


def types(actions: list) -> list[str]:
    return [e["type"] for e in sent(actions)]


# --- audio -----------------------------------------------------------------------------------------------------------
# G.711 reference values (ITU-T G.711 tables, as the retired `audioop` gives them)
@pytest.mark.parametrize(("fmt", "pcm", "code"), [
    (PCMU, 0, 0xFF), (PCMU, -1, 0x7E), (PCMU, 1000, 0xCE), (PCMU, -1000, 0x4E), (PCMU, 32767, 0x80),
    (PCMU, -32768, 0x00), (PCMA, 0, 0xD5), (PCMA, -1, 0x55), (PCMA, 1000, 0xFA), (PCMA, -1000, 0x7A),
    (PCMA, 32767, 0xAA), (PCMA, -32768, 0x2A),
])
def test_g711_encodes_as_the_standard_tables(fmt, pcm: int, code: int) -> None:
    assert from_pcm16(np.array([pcm], "<i2").tobytes(), fmt) == bytes([code])


@pytest.mark.parametrize("fmt", [PCMU, PCMA])
def test_g711_round_trip_keeps_speech_within_its_quantisation(fmt) -> None:
    tone = (8000 * np.sin(np.arange(800) * 2 * np.pi * 440 / 8000)).astype("<i2")
    back = np.frombuffer(to_pcm16(from_pcm16(tone.tobytes(), fmt), fmt), "<i2").astype(float)
    assert np.max(np.abs(back - tone)) <= 256  # the largest step of the top segment used
    assert np.corrcoef(back, tone)[0, 1] > 0.999


def test_odd_pcm16_is_refused() -> None:
    with pytest.raises(Exception, match="whole 16-bit samples"):
        to_pcm16(b"\x00\x01\x02", PCM16_24K)


def test_output_encoder_resamples_to_the_clients_rate_across_chunks() -> None:
    encoder = OutputEncoder(22050, PCM16_24K)
    chunk = (3000 * np.sin(np.arange(2205) * 0.05)).astype("<i2").tobytes()  # 100 ms
    total = sum(len(base64.b64decode(encoder.push(chunk))) for _ in range(10))
    total += len(base64.b64decode(encoder.push(b"", last=True) or ""))
    assert abs(total // 2 - 24000) <= 2  # one second at 24 kHz
    mulaw = OutputEncoder(22050, PCMU)
    out = len(base64.b64decode(mulaw.push(chunk * 10))) + len(base64.b64decode(mulaw.push(b"", last=True) or ""))
    assert abs(out - 8000) <= 2


# --- parsing ---------------------------------------------------------------------------------------------------------
def test_session_update_applies_formats_turn_detection_and_transcription() -> None:
    event = parse({"type": "session.update", "event_id": "e1", "session": {
        "type": "realtime", "instructions": "Be brief.",
        "audio": {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None, "transcription": None},
                  "output": {"format": {"type": "audio/pcma"}}}}})
    assert isinstance(event, SessionUpdate) and event.event_id == "e1"
    s = event.settings
    assert (s.instructions, s.input_format, s.output_format, s.turn_detection, s.transcription) == \
        ("Be brief.", PCMU, PCMA, None, False)
    semantic = parse({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
        "type": "semantic_vad", "eagerness": "high", "create_response": False}}}}})
    assert semantic.settings.turn_detection.eagerness == "high" and not semantic.settings.creates_responses


@pytest.mark.parametrize(("event", "param", "code"), [
    ({"type": "nope.event"}, "type", "unknown_event"),
    ({"type": "session.update", "session": {"voices": "x"}}, "session.voices", "unknown_parameter"),
    ({"type": "session.update", "session": {"tools": [{"type": "mcp", "server_label": "x"}]}},
     "session.tools[0].type", "unsupported"),
    ({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}},
     "session.audio.input.format.rate", "unsupported"),
    ({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "server_vad",
                                                                                     "interrupt_response": False}}}}},
     "session.audio.input.turn_detection.interrupt_response", "unsupported"),
    ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "audio", "invalid_audio"),
    ({"type": "input_audio_buffer.append", "audio": "AAEC"}, "audio", "invalid_audio"),  # 3 bytes: half a sample
    ({"type": "conversation.item.create", "item": {"type": "function_call", "call_id": "c", "name": "f"}},
     "item.type", "unsupported"),
    ({"type": "conversation.item.retrieve", "item_id": "x"}, "type", "unsupported"),
    ({"type": "response.create", "response": {"tools": []}}, "response.tools", "unsupported"),
])
def test_bad_or_unsupported_events_name_what_is_wrong(event: dict, param: str, code: str) -> None:
    with pytest.raises(RealtimeError) as caught:
        parse({**event, "event_id": "client-7"})
    assert (caught.value.param, caught.value.code, caught.value.event_id) == (param, code, "client-7")


def test_malformed_frames_are_errors_never_crashes() -> None:
    for frame in ["{", "[]", '{"type": 3}', '{"type": "session.update"}', '{"type": "session.update", "session": 1}',
                  '{"type": "conversation.item.truncate", "item_id": "x", "content_index": -1, "audio_end_ms": 0}']:
        with pytest.raises(RealtimeError):
            parse_client_event(frame, SessionSettings(), 2000)
    with pytest.raises(RealtimeError, match="binary"):
        parse_client_event(b"\x00\x00", SessionSettings(), 2000)


def test_user_text_item() -> None:
    event = parse({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": " hi there "}]}})
    assert isinstance(event, CreateUserText) and event.text == "hi there"


# --- the translator --------------------------------------------------------------------------------------------------
def translator(**settings) -> RealtimeTranslator:
    t = RealtimeTranslator(S, 22050, "Be helpful.", SessionSettings(**settings))
    assert types(t.start()) == ["session.created"]
    return t


def spoken_turn(t: RealtimeTranslator, turn: int) -> list:
    actions = []
    for event in [ev.SpeechStart(session=S, turn=turn),
                  ev.Transcript(session=S, turn=turn, text="what", committed="what", final=False),
                  ev.SpeechEnd(session=S, turn=turn, detected_ns=0),
                  ev.Transcript(session=S, turn=turn, text="what time is it", committed="", final=True)]:
        actions += t.session_event(event)
    return actions


def answer(t: RealtimeTranslator, turn: int, interrupted: bool = False, started: bool = False) -> list:
    """An answer's events through `t` (after its LmStarted when `started`)."""
    pcm = np.zeros(2205, "<i2").tobytes()
    actions = [] if started else t.session_event(ev.LmStarted(session=S, turn=turn))
    for event in [ev.PhraseCommitted(session=S, turn=turn, phrase_id=0,
                                                                        text="It is noon."),
                  ev.AudioStart(session=S, turn=turn, sample_rate=22050),
                  ev.AudioOut(session=S, turn=turn, pcm=pcm, sample_rate=22050, phrase_id=0),
                  ev.AnswerDone(session=S, turn=turn, text="It is noon.", tokens=5, passes=3, lm_seconds=0.1,
                                finish_reason="stop"),
                  ev.AudioEnd(session=S, turn=turn),
                  ev.TurnEnd(session=S, turn=turn, user_text="what time is it", answer="It is noon.",
                             spoken="It is" if interrupted else "It is noon.", interrupted=interrupted,
                             latency_ms={}, stats={})]:
        actions += t.session_event(event)
    return actions


def test_a_spoken_turn_with_server_vad_becomes_the_realtime_sequence() -> None:
    t = translator()
    assert t.client_event(parse({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\0" * 4800).decode()
                                 })) == [FeedAudio(b"\0" * 4800, 24000)]
    assert types(spoken_turn(t, 1)) == [
        "input_audio_buffer.speech_started", "conversation.item.input_audio_transcription.delta",
        "input_audio_buffer.speech_stopped", "input_audio_buffer.committed", "conversation.item.added",
        "conversation.item.input_audio_transcription.completed"]
    out = sent(answer(t, 1))
    assert [e["type"] for e in out] == [
        "response.created", "response.output_item.added", "conversation.item.added", "response.content_part.added",
        "response.output_audio_transcript.delta", "response.output_audio.delta", "response.output_audio.delta",
        "response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
        "response.output_item.done", "conversation.item.done", "response.done"]
    done = out[-1]["response"]
    assert done["status"] == "completed" and done["usage"]["output_tokens"] == 5
    assert done["output"][0]["content"][0]["transcript"] == "It is noon."
    audio = b"".join(base64.b64decode(e["delta"]) for e in out if e["type"] == "response.output_audio.delta")
    assert abs(len(audio) // 2 - 2400) <= 2  # 100 ms at 24 kHz
    assert len({e["event_id"] for e in out}) == len(out)


def test_an_answer_released_before_the_segment_ends_waits_for_its_user_item_to_be_committed() -> None:
    """The session may release an answer on its likely final, before the segment's end: the protocol's order stays
    speech_stopped, committed, the user item, then the response."""
    t = translator()
    early = [*t.session_event(ev.SpeechStart(session=S, turn=1)), *t.session_event(ev.LmStarted(session=S, turn=1))]
    pcm = np.zeros(2205, "<i2").tobytes()
    early += t.session_event(ev.AudioStart(session=S, turn=1, sample_rate=22050))
    early += t.session_event(ev.AudioOut(session=S, turn=1, pcm=pcm, sample_rate=22050, phrase_id=0))
    assert types(early) == ["input_audio_buffer.speech_started"]
    stopped = types(t.session_event(ev.SpeechEnd(session=S, turn=1, detected_ns=0)))
    assert stopped[:3] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                           "conversation.item.added"]
    assert stopped[3:] == ["response.created", "response.output_item.added", "conversation.item.added",
                           "response.content_part.added", "response.output_audio.delta"]
    assert "response.done" in types(answer(t, 1, started=True))


def test_transcription_off_sends_no_transcription_events() -> None:
    t = translator(transcription=False)
    assert "conversation.item.input_audio_transcription.completed" not in types(spoken_turn(t, 1))


def test_typed_items_wait_for_response_create() -> None:
    t = translator()
    item = t.client_event(parse({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
    assert types(item) == ["conversation.item.added", "conversation.item.done"]
    assert t.client_event(parse({"type": "response.create"})) == [SendText("hello")]
    events = t.session_event(ev.Transcript(session=S, turn=1, text="hello", committed="hello", final=True))
    assert events == []  # a typed turn's transcript is the item itself
    assert "response.done" in types(answer(t, 1))
    with pytest.raises(RealtimeError, match="nothing to respond to"):
        t.client_event(parse({"type": "response.create"}))


def test_manual_turn_detection_commits_then_releases_the_answer_on_response_create() -> None:
    t = translator(turn_detection=None)
    append = parse({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\1\0" * 2400).decode()})
    assert t.client_event(append) == []  # held until the commit
    actions = t.client_event(parse({"type": "input_audio_buffer.commit"}))
    assert types(actions) == ["input_audio_buffer.committed", "conversation.item.added"]
    assert [a for a in actions if not isinstance(a, Send)] == [FeedAudio(b"\1\0" * 2400, 24000), EndAudio()]
    item_id = sent(actions)[0]["item_id"]
    turn = spoken_turn(t, 1)
    assert types(turn) == ["conversation.item.input_audio_transcription.delta",
                           "conversation.item.input_audio_transcription.completed"]
    assert {e["item_id"] for e in sent(turn)} == {item_id}
    assert t.session_event(ev.LmStarted(session=S, turn=1)) == []  # held: nobody asked yet
    released = t.client_event(parse({"type": "response.create"}))
    assert types(released)[0] == "response.created"
    with pytest.raises(RealtimeError, match="input audio buffer is empty"):
        t.client_event(parse({"type": "input_audio_buffer.commit"}))


def test_response_create_before_the_answer_starts_releases_it_at_once() -> None:
    t = translator(turn_detection=None)
    t.client_event(parse({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\0" * 480).decode()}))
    t.client_event(parse({"type": "input_audio_buffer.commit"}))
    assert t.client_event(parse({"type": "response.create"})) == []
    spoken_turn(t, 1)
    assert types(answer(t, 1))[0] == "response.created"


def test_cancel_and_truncate_report_what_was_heard() -> None:
    t = translator()
    spoken_turn(t, 1)
    assert types(t.session_event(ev.LmStarted(session=S, turn=1))) == ["response.created"]
    pcm = np.zeros(22050, "<i2").tobytes()  # one second
    begun = sent(t.session_event(ev.AudioOut(session=S, turn=1, pcm=pcm, sample_rate=22050, phrase_id=0)))
    item_id = begun[0]["item"]["id"]  # the message item begins with its first content
    assert t.client_event(parse({"type": "response.cancel"})) == [Interrupt()]
    truncate = t.client_event(parse({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                                     "audio_end_ms": 400}))
    assert truncate[0] == TruncateHeard(22050 * 400 // 1000, 1)
    assert types(truncate) == ["conversation.item.truncated"]
    with pytest.raises(RealtimeError, match="past the"):
        t.client_event(parse({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                              "audio_end_ms": 5000}))
    t.session_event(ev.Clear(session=S, turn=1, reason="interrupt"))
    done = sent(t.session_event(ev.TurnEnd(session=S, turn=1, user_text="x", answer="It is noon.", spoken="It is",
                                           interrupted=True, latency_ms={}, stats={})))
    assert done[-1]["response"]["status"] == "cancelled"
    assert done[-1]["response"]["status_details"]["reason"] == "client_cancelled"
    assert done[-1]["response"]["output"][0]["content"][0]["transcript"] == "It is"
    with pytest.raises(RealtimeError, match="no response in progress"):
        t.client_event(parse({"type": "response.cancel"}))


def test_session_update_changes_instructions_and_reports_the_session() -> None:
    t = translator()
    actions = t.client_event(parse({"type": "session.update", "session": {"instructions": "Speak French."}}))
    assert actions[0] == SetInstructions("Speak French.")
    updated = sent(actions)[0]
    assert updated["session"]["instructions"] == "Speak French."
    assert t.client_event(parse({"type": "session.update", "session": {"instructions": None}}))[0] == \
        SetInstructions(None)


def test_session_errors_become_realtime_errors() -> None:
    t = translator()
    out = sent(t.session_event(ev.ErrorEvent(session=S, turn=1, code="asr_failed", message="boom")))
    assert out[0]["error"]["type"] == "server_error" and out[0]["error"]["code"] == "asr_failed"
    refused = sent([t.error(RealtimeError("bad", "unknown_event", "type", "e9"))])[0]
    assert refused["error"] == {"type": "invalid_request_error", "code": "unknown_event", "message": "bad",
                                "param": "type", "event_id": "e9"}


def test_appends_are_decoded_from_the_input_format() -> None:
    t = translator()
    t.client_event(parse({"type": "session.update", "session": {"audio": {"input": {"format": {
        "type": "audio/pcmu"}}}}}))
    event = parse_client_event(json.dumps({"type": "input_audio_buffer.append",
                                           "audio": base64.b64encode(b"\xff" * 160).decode()}), t.settings, 2000)
    assert isinstance(event, AppendAudio)
    assert t.client_event(event) == [FeedAudio(b"\0\0" * 160, 8000)]


def test_a_finished_answer_can_be_truncated_once_it_is_the_newest() -> None:
    t = translator()
    spoken_turn(t, 1)
    out = sent(answer(t, 1))
    item_id = out[1]["item"]["id"]
    actions = t.client_event(parse({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                                    "audio_end_ms": 50}))
    assert actions[0] == TruncateHeard(22050 * 50 // 1000, 1) and types(actions) == ["conversation.item.truncated"]
    with pytest.raises(RealtimeError, match="no assistant item"):
        t.client_event(parse({"type": "conversation.item.truncate", "item_id": "item_other", "content_index": 0,
                              "audio_end_ms": 0}))


def test_truncated_while_running_yet_finished_in_full_still_truncates_the_history() -> None:
    t = translator()
    spoken_turn(t, 1)
    t.session_event(ev.LmStarted(session=S, turn=1))
    item_id = sent(t.session_event(ev.AudioOut(session=S, turn=1, pcm=np.zeros(22050, "<i2").tobytes(),
                                               sample_rate=22050, phrase_id=0)))[0]["item"]["id"]
    t.client_event(parse({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                          "audio_end_ms": 100}))
    ended = t.session_event(ev.TurnEnd(session=S, turn=1, user_text="x", answer="It is noon.", spoken="It is noon.",
                                       interrupted=False, latency_ms={}, stats={}))
    assert TruncateHeard(2205, 1) in ended


def test_a_tool_the_session_ran_is_a_function_call_and_its_output_before_the_spoken_message() -> None:
    t = translator()
    spoken_turn(t, 1)
    t.session_event(ev.LmStarted(session=S, turn=1))
    called = sent(t.session_event(ev.ToolCalled(session=S, turn=1, name="get_time", arguments="{}",
                                                result="It is 12:00.", error="", seconds=0.01)))
    assert [e["type"] for e in called] == [
        "response.output_item.added", "conversation.item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "conversation.item.done",
        "conversation.item.added", "conversation.item.done"]
    call_id = called[3]["call_id"]
    assert called[3]["name"] == "get_time" and called[3]["output_index"] == 0
    assert called[-1]["item"] == {**called[-1]["item"], "type": "function_call_output", "call_id": call_id,
                                  "output": "It is 12:00."}
    rest = sent(answer(t, 1, started=True))
    message = next(e for e in rest if e["type"] == "response.output_item.added")
    assert message["output_index"] == 1 and message["item"]["role"] == "assistant"
    assert {e["output_index"] for e in rest if "output_index" in e} == {1}
    done = rest[-1]["response"]
    assert [item["type"] for item in done["output"]] == ["function_call", "message"]


def test_a_user_item_of_audio_is_heard_and_answered_on_request_only() -> None:
    t = translator()  # server VAD, create_response on: a spoken turn would be answered by itself
    pcm = b"\1\0" * 2400
    event = parse({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_audio", "audio": base64.b64encode(pcm).decode()}]}})
    actions = t.client_event(event)
    assert types(actions) == ["conversation.item.added"]
    assert [a for a in actions if not isinstance(a, Send)] == [FeedAudio(pcm, 24000), EndAudio()]
    item_id = sent(actions)[0]["item"]["id"]
    heard = spoken_turn(t, 1)
    assert types(heard) == ["conversation.item.input_audio_transcription.delta",
                            "conversation.item.input_audio_transcription.completed"]  # no VAD events of its own
    assert {e["item_id"] for e in sent(heard)} == {item_id}
    assert t.session_event(ev.LmStarted(session=S, turn=1)) == []  # held until asked
    assert types(t.client_event(parse({"type": "response.create"}))) == ["response.created"]
    with pytest.raises(RealtimeError, match="alone"):
        parse({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
            {"type": "input_audio", "audio": "AAAA"}, {"type": "input_text", "text": "x"}]}})


def test_response_instructions_hold_for_that_response_only() -> None:
    t = translator()
    t.client_event(parse({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
    create = parse({"type": "response.create", "response": {"instructions": "Answer in one word."}})
    assert t.client_event(create) == [SetInstructions("Answer in one word."), SendText("hello")]
    ended = answer(t, 1)
    assert [a for a in ended if isinstance(a, SetInstructions)] == [SetInstructions(None)]  # the session's again
    spoken_turn(t, 2)
    assert not [a for a in answer(t, 2) if isinstance(a, SetInstructions)]  # a plain response leaves them be
    held = translator(turn_detection=None)
    held.client_event(parse({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\0" * 480).decode()}))
    held.client_event(parse({"type": "input_audio_buffer.commit"}))
    spoken_turn(held, 1)
    held.session_event(ev.LmStarted(session=S, turn=1))  # written already, held
    with pytest.raises(RealtimeError, match="already written"):
        held.client_event(create)


def test_response_create_after_an_answered_spoken_turn_has_nothing_new() -> None:
    t = translator()
    spoken_turn(t, 1)
    answer(t, 1)
    with pytest.raises(RealtimeError, match="nothing to respond to"):
        t.client_event(parse({"type": "response.create"}))
    spoken_turn(t, 2)  # words not answered yet: the request waits for their answer
    assert t.client_event(parse({"type": "response.create"})) == []
