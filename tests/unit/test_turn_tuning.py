"""A Realtime session's `turn_detection` applied to its own session: `server_vad`'s threshold, silence and prefix
padding tune the endpointer and the listener's lead-in, `semantic_vad`'s eagerness scales the end-of-turn rule's
waits; what cannot be applied is refused by name (no models: the endpointer on scripted probabilities, the session
shell with a fake listener)."""

from __future__ import annotations

import asyncio
import json

import pytest

import voice.turn.session as session_module
from tests.unit.test_realtime_protocol import parse, sent, translator
from tests.unit.test_session_shell import FakeListen, FakeLM, FakeTTS
from voice.engines import Engines
from voice.errors import ProtocolError
from voice.listen.endpointer import Endpointer
from voice.listen.stage import ListenConfig
from voice.turn.machine_config import TurnTakingConfig
from voice.turn.session import Session, SessionConfig
from voice.turn.tuning import TurnTuning
from web.realtime.actions import TuneTurns
from web.realtime.client_events import RealtimeError, parse_client_event

TD = "session.audio.input.turn_detection"


def update(turn_detection: dict | None) -> dict:
    return {"type": "session.update", "session": {"audio": {"input": {"turn_detection": turn_detection}}}}


def speech_end_ms(tuning: TurnTuning, silence_windows: int = 40) -> float | None:
    """When the endpointer closes 1 s of speech (probability 0.45) followed by silence, in ms of audio."""
    endpointer = Endpointer(tuning.listen(ListenConfig()).endpointer)
    for probability in [0.45] * 31 + [0.0] * silence_windows:
        decision = endpointer.push(probability)
        if decision is not None and decision.kind == "speech_end":
            return decision.decided_at / 16
    return None


def test_server_vad_threshold_and_silence_tune_the_endpointer() -> None:
    assert speech_end_ms(TurnTuning()) is None  # 0.45 is under the server's threshold (0.5): no speech at all
    assert speech_end_ms(TurnTuning(vad_threshold=0.4)) == pytest.approx(992 + 320, abs=32)  # the server's silence
    assert speech_end_ms(TurnTuning(vad_threshold=0.4, silence_ms=800)) == pytest.approx(992 + 800, abs=32)
    short = TurnTuning(silence_ms=32).listen(ListenConfig())
    assert short.endpointer.min_silence_ms == 32 and short.endpointer.speech_pad_ms == 32  # padding fits in it
    assert TurnTuning(prefix_ms=500).listen(ListenConfig()).lead_in_ms == 500


def test_eagerness_scales_the_end_of_turn_waits() -> None:
    base = TurnTakingConfig()
    eager = TurnTuning(patience=0.5).turn_taking(base)
    assert (eager.complete_silence_ms, eager.incomplete_silence_ms, eager.question_silence_ms,
            eager.silence_rule_ms) == (100, 750, 400, 300)
    assert TurnTuning().turn_taking(base) is base
    assert TurnTuning(patience=2.0).turn_taking(base).incomplete_silence_ms == 3000


def test_turn_detection_becomes_the_tuning_the_translator_hands_the_session() -> None:
    t = translator()
    server = update({"type": "server_vad", "threshold": 0.7, "silence_duration_ms": 900, "prefix_padding_ms": 200})
    actions = t.client_event(parse_client_event(json.dumps(server), t.settings, 2000))
    assert actions[0] == TuneTurns(TurnTuning(0.7, 900, 200))
    echoed = sent(actions)[-1]["session"]["audio"]["input"]["turn_detection"]
    assert (echoed["threshold"], echoed["silence_duration_ms"], echoed["prefix_padding_ms"]) == (0.7, 900, 200)
    plain = t.client_event(parse_client_event(json.dumps(update({"type": "server_vad"})), t.settings, 2000))
    assert plain[0] == TuneTurns(TurnTuning())
    echoed = sent(plain)[-1]["session"]["audio"]["input"]["turn_detection"]
    assert (echoed["threshold"], echoed["silence_duration_ms"], echoed["prefix_padding_ms"]) == (0.5, 320, 300)
    eager = t.client_event(parse_client_event(json.dumps(update({"type": "semantic_vad", "eagerness": "high"})),
                                              t.settings, 2000))
    assert eager[0] == TuneTurns(TurnTuning(patience=0.5))
    again = t.client_event(parse_client_event(json.dumps(update({"type": "semantic_vad", "eagerness": "high"})),
                                              t.settings, 2000))
    assert not any(isinstance(a, TuneTurns) for a in again)  # nothing changed


@pytest.mark.parametrize(("turn_detection", "param"), [
    ({"type": "server_vad", "threshold": 0.0}, f"{TD}.threshold"),
    ({"type": "server_vad", "threshold": 1}, f"{TD}.threshold"),
    ({"type": "server_vad", "idle_timeout_ms": 5000}, f"{TD}.idle_timeout_ms"),
    ({"type": "server_vad", "silence_duration_ms": 60_000}, f"{TD}.silence_duration_ms"),
    ({"type": "server_vad", "prefix_padding_ms": 5_000}, f"{TD}.prefix_padding_ms"),
])
def test_what_cannot_be_applied_is_refused_by_name(turn_detection: dict, param: str) -> None:
    with pytest.raises(RealtimeError) as caught:
        parse(update(turn_detection))
    assert caught.value.param == param and caught.value.code == "unsupported"


def test_the_session_applies_a_tuning_to_its_listener_and_its_turn_taking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "ListenStage", FakeListen)

    async def scenario() -> tuple[Session, FakeListen]:
        engines = Engines(asr=None, tts=FakeTTS(), lm=FakeLM(), load_seconds={})  # type: ignore[arg-type]
        session = Session(engines, SessionConfig())
        session.tune_turns(TurnTuning(silence_ms=700))  # before the listener exists: it starts tuned
        await session.start()
        listen = FakeListen.instances[-1]
        assert listen.config.endpointer.min_silence_ms == 700
        session.tune_turns(TurnTuning(vad_threshold=0.6, prefix_ms=100, patience=2.0))
        with pytest.raises(ProtocolError):
            session.tune_turns(TurnTuning(vad_threshold=1.5))
        await session.close()
        return session, listen

    session, listen = asyncio.run(scenario())
    assert listen.config.endpointer.threshold == 0.6 and listen.config.endpointer.min_silence_ms == 320
    assert listen.config.lead_in_ms == 100
    assert session.core.machine.config.incomplete_silence_ms == 3000  # the refused tuning changed nothing
    assert session.core.machine._end_of_turn.incomplete_ms == 3000  # the rule decides by it
    assert session.turn_tuning == TurnTuning(0.6, 320, 100, 2.0)
