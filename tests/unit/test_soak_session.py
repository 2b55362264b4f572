"""The soak's bookkeeping without a server: which messages are late, and the verdicts over a soak's turns."""

from __future__ import annotations

from scripts.soak_session import Listener, SoakTurn, summarise


def test_output_of_an_earlier_turn_after_the_next_began_is_late() -> None:
    heard = Listener(22050)
    heard.on_text({"type": "vad", "state": "speech_start", "turn": 1}, 0.0)
    heard.on_text({"type": "turn_end", "turn": 1}, 1.0)
    heard.on_text({"type": "vad", "state": "speech_start", "turn": 2}, 2.0)
    heard.on_text({"type": "answer", "turn": 1, "text": "stale"}, 3.0)  # a split turn's second answer, delivered late
    heard.on_text({"type": "audio_start", "turn": 1}, 3.1)
    heard.on_audio(b"\0" * 441, 3.2)
    heard.on_text({"type": "audio_start", "turn": 2}, 4.0)
    heard.on_audio(b"\0" * 882, 4.1)
    assert heard.late == {2: 2}
    assert heard.audio_bytes == {1: 441, 2: 882}


def turn(index: int, v2v: float, rss: float, **extra: object) -> SoakTurn:
    fields: dict[str, object] = {"turn": index, "voice_to_voice_ms": v2v, "audio_s": 1.0, "in_step": True}
    fields["rss_mb"] = rss
    return SoakTurn(index, "clip.wav", **(fields | extra))  # type: ignore[arg-type]


def test_verdicts() -> None:
    turns = [turn(i, 1000 + (300 if i > 50 else 0), 1000 + i) for i in range(1, 61)]
    summary = summarise(turns, max_growth_mb=150)
    assert summary["p50_first_ms"] == 1000 and summary["p50_last_ms"] == 1300
    # medians of turns 5-14 and 51-60 (the warm-up's 5 turns excluded): 1009.5 -> 1055.5
    assert summary["rss_growth_after_warmup_mb"] == 46
    verdicts = summary["verdicts"]
    assert not verdicts["p50_last_within_20_percent_of_first"]  # +30 %
    assert verdicts["memory_growth_within_bound"] and verdicts["every_turn_answered_with_audio_and_in_step"]
    turns[7] = turn(8, 1000, 1008, non_words=["that'm"])
    turns[9] = turn(10, 1000, 1010, in_step=False)
    verdicts = summarise(turns, max_growth_mb=40)["verdicts"]
    assert not verdicts["no_loop_no_non_word"]
    assert not verdicts["every_turn_answered_with_audio_and_in_step"]
    assert not verdicts["memory_growth_within_bound"]


def test_memory_growth_is_the_trend_not_a_peak() -> None:
    """A turn's working set swings RSS up and back (a peak); only memory that stays counts as growth."""
    swinging = [turn(i, 1000, 1000 + (250 if i % 4 == 0 else 0)) for i in range(1, 61)]
    summary = summarise(swinging, max_growth_mb=150)
    assert summary["rss_mb_max_after_warmup"] == 1250 and summary["verdicts"]["memory_growth_within_bound"]
    stepped = [turn(i, 1000, 1000 + (200 if i > 30 else 0)) for i in range(1, 61)]
    summary = summarise(stepped, max_growth_mb=150)
    assert summary["rss_growth_after_warmup_mb"] == 200 and not summary["verdicts"]["memory_growth_within_bound"]
