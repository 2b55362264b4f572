"""The voice session's tools (voice/tools/): the built-ins with an injected clock, the tool loop's core, and the loop
run by the session shell with a scripted LM and a fake voice (no models): calls never spoken, results in the
history as role "tool" messages, a filler while a tool is slow, an apology for a failed tool, a timer said between
turns."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

import voice.turn.session as session_module
from model.chat import ChatMessage, Draft, DraftPiece, GenerationOptions
from model.chat.tools import ToolCall, call_text
from tests.unit.test_session_shell import FakeListen, FakeTTS, started, until
from voice.engines import Engines
from voice.errors import ToolError
from voice.events import (
    AnswerDone,
    DraftUpdate,
    Event,
    SpeechStart,
    ToolCalled,
    Transcript,
    TurnEnd,
    VoiceResumed,
    now_ns,
)
from voice.think.spoken import spoken_answer
from voice.tools import announcements
from voice.tools.builtin import BUILTIN_FUNCTIONS, BuiltinTools
from voice.tools.calculator import calculate, convert, spoken_number
from voice.tools.loop import COULD_NOT_FINISH, Apologise, RunTools, Speak, ToolLoop
from voice.tools.timers import Timers, spoken_now
from voice.tools.toolbox import Toolbox, ToolsConfig
from voice.turn.machine import TurnTaking
from voice.turn.machine_events import AssistantAnnounces, StartAnswer, State
from voice.turn.session import Session, SessionConfig


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


WALL = dt.datetime(2026, 12, 4, 16, 5, tzinfo=dt.timezone(dt.timedelta(hours=1), "CET"))


# --- the built-ins ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12 * (3 + 4)", 84),
        ("7 times 6", 42),
        ("1,000 divided by 8", 125),
        ("2 to the power of 10", 1024),
        ("-3 + 5 % 3", -1),
        ("9 squared", 81),
        ("10 / 4", 2.5),
    ],
)
def test_the_calculator_reads_spoken_arithmetic(expression: str, value: float) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('true')", "only do arithmetic"),
        ("abs(-3)", "only do arithmetic"),
        ("1/0", "divides by zero"),
        ("9**9**9", "too large"),
        ("(9**300)**300", "too large"),
        ("2 +", "could not read"),
        ("x" * 300, "short sum"),
    ],
)
def test_the_calculator_refuses_what_is_not_arithmetic_as_speech(expression: str, reason: str) -> None:
    with pytest.raises(ToolError, match=reason):
        calculate(expression)


def test_unit_conversion_covers_lengths_masses_and_temperatures() -> None:
    assert convert(5, "miles", "km") == pytest.approx(8.04672)
    assert convert(1, "pound", "grams") == pytest.approx(453.59237)
    assert convert(212, "Fahrenheit", "celsius") == pytest.approx(100)
    assert convert(1.5, "hours", "minutes") == pytest.approx(90)
    assert spoken_number(convert(100, "degrees celsius", "F")) == "212"
    with pytest.raises(ToolError, match="cannot be converted"):
        convert(1, "kg", "km")
    with pytest.raises(ToolError, match="don't know the unit furlongs"):
        convert(1, "furlongs", "m")


def test_the_time_is_the_local_clock_with_its_zone() -> None:
    tools = BuiltinTools(Timers(FakeClock(), wall=lambda: WALL))
    assert tools.call("get_time", {}) == "It is 4:05 PM on Friday, December 4, 2026 (CET)."
    assert spoken_now(WALL.replace(hour=0, minute=30)).startswith("It is 12:30 AM")


def test_timers_fall_due_on_their_clock_and_can_be_listed_and_cancelled() -> None:
    clock = FakeClock()
    timers = Timers(clock, wall=lambda: WALL)
    tools = BuiltinTools(timers)
    assert tools.call("set_timer", {"minutes": 5, "label": "tea"}) == "Timer set for 5 minutes."
    assert tools.call("set_timer", {"seconds": 90}) == "Timer set for 1 minute 30 seconds."
    assert tools.call("set_alarm", {"time": "16:00"}) == "Alarm set for 4:00 PM."  # tomorrow: 16:00 has passed
    assert timers.next_due() == 90
    clock.now += 60
    assert tools.call("list_timers", {}).startswith("timer with 30 seconds left; tea timer with 4 minutes left;")
    assert timers.due() == []
    clock.now += 30
    [due] = timers.due()
    assert due.announcement() == "Your timer for 1 minute 30 seconds is done."
    assert tools.call("cancel_timer", {"label": "tea"}) == "Cancelled 1 timer."
    with pytest.raises(ToolError, match="no tea timer"):
        tools.call("cancel_timer", {"label": "tea"})
    clock.now += 86400
    [alarm] = timers.due()
    assert alarm.announcement() == "It's 4:00 PM: your alarm."
    with pytest.raises(ToolError, match="between one second and a week"):
        tools.call("set_timer", {})


def test_every_builtin_schema_compiles_in_the_grammar_engine() -> None:
    from model.chat.tools import constraint
    from model.decoding.grammar import compile_tools

    compile_tools(constraint(BUILTIN_FUNCTIONS, required=True))


# --- the loop's core ------------------------------------------------------------------------------------------------
def test_the_tool_loop_runs_calls_then_asks_for_words() -> None:
    user = [ChatMessage("user", "what is 6 times 7")]
    loop = ToolLoop(user, BUILTIN_FUNCTIONS, spoken_answer(), max_rounds=1)
    first = loop.options()
    assert first.tools is not None and not first.tools.required
    assert first.system_prompt is not None and '"name":"calculate"' in first.system_prompt
    text = call_text("calculate", '{"expression": "6*7"}')
    decision = loop.answered(text)
    assert decision == RunTools((ToolCall("calculate", '{"expression":"6*7"}', True),))
    assert loop.results(decision.calls, ["42"]) is None
    assert [m.role for m in loop.messages] == ["user", "assistant", "tool"]
    assert loop.messages[1].content == text and loop.messages[2].content == "42"
    assert loop.options().tools is None  # no rounds left: words only, the same system prompt (cached)
    assert loop.options().system_prompt == first.system_prompt
    assert loop.answered("It is 42.") == Speak()
    assert loop.answered(text) == Apologise(COULD_NOT_FINISH)  # calls where words were due


def test_a_failed_call_or_a_cut_one_is_an_apology() -> None:
    loop = ToolLoop([ChatMessage("user", "x")], BUILTIN_FUNCTIONS, spoken_answer())
    assert loop.answered('<tool_call>{"name":"calculate","arguments":{"expr') == Apologise(COULD_NOT_FINISH)
    calls = (ToolCall("calculate", '{"expression":"1/0"}', True),)
    assert loop.results(calls, [ToolError("that divides by zero")]) == Apologise("Sorry, that divides by zero.")
    assert loop.added[-1] == ChatMessage("tool", "error: that divides by zero")


def test_an_announcement_takes_only_a_free_floor() -> None:
    machine = TurnTaking()
    [start] = machine.handle(AssistantAnnounces("Your timer is done."))
    assert start == StartAnswer(1, 1, "Your timer is done.", held=False, announcement=True)
    assert machine.state is State.ANSWERING
    assert machine.handle(AssistantAnnounces("Another.")) == []  # the floor is taken: the shell asks again later


# --- the loop in the session shell -----------------------------------------------------------------------------------
class ScriptedLM:
    """Answers by rules on the chat: `calls(user_text)` -> a call text when the answer may be calls; after a tool
    result, "Done: <result>". Words are committed one a pass."""

    name = "scripted"
    constrains_answers = True  # it writes calls only where the options allow them, as a grammar would

    def __init__(self, calls: Callable[[str], str | None]) -> None:
        self.calls = calls
        self.requests: list[tuple[list[ChatMessage], GenerationOptions]] = []

    def stream_chat(
        self, messages: Sequence[ChatMessage], options: GenerationOptions, cancel: threading.Event | None = None
    ) -> Iterator[Draft]:
        self.requests.append((list(messages), options))
        last = messages[-1]
        call = self.calls(last.content) if last.role == "user" and options.tools is not None else None
        if call is not None:
            words = call.split(" ")  # a call in a model's own form, with spaces, is written word by word too
        elif last.role == "tool":
            words = f"Done: {last.content}".split()
        else:
            words = ["Just", "words."]
        for step in range(len(words)):
            if cancel is not None and cancel.is_set():
                return
            time.sleep(0.003)
            pieces = tuple(DraftPiece((" " if i else "") + word, True) for i, word in enumerate(words[: step + 1]))
            done = step == len(words) - 1
            yield Draft(step, pieces, done=done, finish_reason="stop" if done else None, completion_tokens=step + 1)


class SlowToolbox(Toolbox):
    """The built-ins, and `calculate` takes `delay_s` (a tool that takes its time)."""

    def __init__(self, delay_s: float, timers: Timers | None = None) -> None:
        super().__init__(ToolsConfig(), timers)
        self.delay_s = delay_s

    async def call(self, name: str, arguments: str) -> str:
        await asyncio.sleep(self.delay_s)
        return await super().call(name, arguments)


@pytest.fixture
def tool_session(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(session_module, "ListenStage", FakeListen)
    monkeypatch.setattr(announcements, "TIMER_POLL_S", 0.02)

    def make(lm: ScriptedLM, toolbox: Toolbox | None = None) -> Session:
        engines = Engines(asr=None, tts=FakeTTS(), lm=lm, load_seconds={})  # type: ignore[arg-type]
        session = Session(
            engines,
            SessionConfig(generation=spoken_answer(max_new_tokens=32), tools=ToolsConfig(), wait_for_playback=False),
        )
        if toolbox is not None:
            session.toolbox = session._answers.toolbox = toolbox
        return session

    return make


def _calls(user: str) -> str | None:
    if "long timer" in user:
        return call_text("set_timer", '{"minutes":10}')
    if "timer" in user:
        return call_text("set_timer", '{"seconds":0.3}')
    if "time" in user:
        return call_text("get_time", "{}")
    if "divide" in user:
        return call_text("calculate", '{"expression":"1/0"}')
    if "sum" in user:
        return call_text("calculate", '{"expression":"6*7"}')
    return None


async def _turn(session: Session, events: list[Event], text: str) -> TurnEnd:
    ends = sum(isinstance(e, TurnEnd) for e in events)
    await session.send_text(text)
    await until(lambda: sum(isinstance(e, TurnEnd) for e in events) > ends)
    return [e for e in events if isinstance(e, TurnEnd)][ends]


def test_a_tool_call_is_run_never_spoken_and_kept_in_the_history(tool_session) -> None:
    async def scenario() -> tuple[ScriptedLM, Session, list[Event], TurnEnd]:
        lm = ScriptedLM(_calls)
        session = tool_session(lm)
        _, events, collector = await started(session)
        end = await _turn(session, events, "what time is it")
        await session.close()
        await collector
        return lm, session, events, end

    lm, session, events, end = asyncio.run(scenario())
    assert "<tool_call>" not in "".join(e.draft for e in events if isinstance(e, DraftUpdate))
    [called] = [e for e in events if isinstance(e, ToolCalled)]
    assert called.name == "get_time" and called.result.startswith("It is ") and not called.error
    assert end.answer == f"Done: {called.result}" and end.spoken == end.answer
    assert end.stats["tool_calls"] == 1
    assert [m.role for m in session.dialogue.history] == ["user", "assistant", "tool", "assistant"]
    assert session.dialogue.history[1].content == call_text("get_time", "{}")
    (_, first_options), (second, second_options) = lm.requests
    assert first_options.tools is not None and second_options.tools is not None  # a round left: words or calls
    assert [m.role for m in second] == ["user", "assistant", "tool"]
    assert first_options.system_prompt == second_options.system_prompt


def test_a_slow_tool_gets_a_filler_and_a_failed_one_an_apology(tool_session) -> None:
    async def scenario() -> tuple[list[Event], TurnEnd, TurnEnd]:
        session = tool_session(ScriptedLM(_calls), SlowToolbox(delay_s=0.5))
        _, events, collector = await started(session)
        slow = await _turn(session, events, "what is the sum")
        failed = await _turn(session, events, "divide one by zero")
        after = await _turn(session, events, "hello")
        await session.close()
        await collector
        return events, slow, failed, after

    events, slow, failed, after = asyncio.run(scenario())
    drafts = [e for e in events if isinstance(e, DraftUpdate) and e.turn == slow.turn]
    assert drafts[-1].committed == "One moment. Done: 42"  # the filler, said while the tool ran, then the answer
    assert slow.answer == "Done: 42"
    assert failed.answer == "Sorry, that divides by zero." and not failed.interrupted
    assert after.answer == "Just words."  # the session goes on
    assert [e.error for e in events if isinstance(e, ToolCalled)] == ["", "that divides by zero"]


def test_a_timer_set_by_a_turn_is_said_between_turns(tool_session) -> None:
    async def scenario() -> tuple[list[Event], TurnEnd, TurnEnd]:
        session = tool_session(ScriptedLM(_calls))
        _, events, collector = await started(session)
        set_it = await _turn(session, events, "set a timer")
        await until(lambda: sum(isinstance(e, TurnEnd) for e in events) == 2)
        announced = [e for e in events if isinstance(e, TurnEnd)][1]
        history = list(session.dialogue.history)
        await session.close()
        await collector
        return events, set_it, announced, history

    events, set_it, announced, history = asyncio.run(scenario())
    assert set_it.answer == "Done: Timer set for 0 seconds."  # 0.3 s, said in whole seconds
    assert announced.user_text == "" and announced.stats["announcement"] == 1
    assert announced.answer.startswith("Your timer for") and announced.answer.endswith("is done.")
    assert any(isinstance(e, AnswerDone) and e.text == announced.answer for e in events)
    assert history[-1] == ChatMessage("assistant", announced.answer)


def test_a_timer_survives_the_barge_in_that_cancels_its_answer(tool_session) -> None:
    async def scenario() -> tuple[TurnEnd, TurnEnd]:
        session = tool_session(ScriptedLM(_calls), SlowToolbox(delay_s=0.0))
        _, events, collector = await started(session)
        await session.send_text("set a timer")
        await until(lambda: any(isinstance(e, ToolCalled) for e in events))
        await session.interrupt()  # the answer that set it is cut off
        await until(lambda: sum(isinstance(e, TurnEnd) for e in events) == 2)
        interrupted, announced = [e for e in events if isinstance(e, TurnEnd)]
        await session.close()
        await collector
        return interrupted, announced

    interrupted, announced = asyncio.run(scenario())
    assert interrupted.interrupted
    assert announced.stats["announcement"] == 1 and announced.answer.endswith("is done.")


def test_a_model_that_cannot_constrain_its_answers_is_offered_no_tools(tool_session) -> None:
    from tests.unit.test_session_shell import FakeLM

    session = tool_session(FakeLM())  # type: ignore[arg-type]
    assert session.toolbox is None
    assert tool_session(ScriptedLM(_calls)).toolbox is not None


def test_an_early_answer_dropped_by_more_speech_never_runs_its_tool(tool_session) -> None:
    async def scenario() -> tuple[list[Event], Session]:
        session = tool_session(ScriptedLM(_calls))
        listen, events, collector = await started(session)
        start = now_ns()
        await listen.emit(SpeechStart(session="s", turn=0, t_ns=start))
        await listen.emit(Transcript(session="s", turn=0, text="set a long timer", committed="", final=False,
                                     likely_final=True))  # the answer starts here, held
        await asyncio.sleep(0.3)  # its call is written long before
        await listen.emit(VoiceResumed(session="s", turn=0))  # the user goes on: the held answer is dropped
        await asyncio.sleep(0.1)
        await session.close()
        await collector
        return events, session

    events, session = asyncio.run(scenario())
    assert session.toolbox is not None and session.toolbox.timers.pending() == []
    assert not any(isinstance(e, ToolCalled) for e in events)


def test_the_tool_flags_build_the_sessions_tools_config() -> None:
    from web.cli import build_parser, session_config

    def tools(*argv: str) -> ToolsConfig | None:
        return session_config(build_parser().parse_args(list(argv)), full_duplex=True).tools

    assert tools("--tools", "serve") == ToolsConfig()
    both = ToolsConfig(mcp=("python a.py", "b --x"))
    assert tools("serve", "--tools", "--mcp", "python a.py", "--mcp", "b --x") == both
    assert tools("serve") is None
    assert tools("serve", "--mcp", "python a.py") == ToolsConfig(builtins=False, mcp=("python a.py",))
    # a remote model gets the tools too (the client passes them on)
    assert tools("serve", "--llm-url", "http://x/v1", "--mcp", "python a.py") == ToolsConfig(builtins=False,
                                                                                          mcp=("python a.py",))


def test_a_timer_due_while_the_user_speaks_waits_for_the_floor(tool_session) -> None:
    async def scenario() -> list[Event]:
        session = tool_session(ScriptedLM(_calls))
        listen, events, collector = await started(session)
        await _turn(session, events, "set a timer")  # 0.3 s
        await listen.emit(SpeechStart(session="s", turn=0, t_ns=now_ns()))  # the user takes the floor ...
        await asyncio.sleep(0.6)  # ... and holds it past the timer's moment
        held_back = not any(isinstance(e, TurnEnd) and e.stats.get("announcement") for e in events)
        await listen.emit(Transcript(session="s", turn=0, text="hello", committed="hello", final=True))
        await session.user_done()
        await until(lambda: sum(isinstance(e, TurnEnd) for e in events) == 3)
        await session.close()
        await collector
        assert held_back
        return events

    events = asyncio.run(scenario())
    ends = [e for e in events if isinstance(e, TurnEnd)]
    assert [end.user_text for end in ends] == ["set a timer", "hello", ""]  # said after the user's turn, not over it
    assert ends[2].stats["announcement"] == 1


@pytest.mark.parametrize("form", [
    '{"name": "get_time", "arguments": {}}',  # bare, as small models write it
    '```json\n{"name": "get_time", "arguments": {}}\n```',  # fenced
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',  # Qwen2.5's spacing
])
def test_a_call_in_a_models_own_form_is_run_never_spoken_and_kept_in_the_generic_form(tool_session, form) -> None:
    """Written word by word, the call is never shown: each draft either may still become a call or is one."""

    async def scenario() -> tuple[Session, list[Event], TurnEnd]:
        session = tool_session(ScriptedLM(lambda user: form if "time" in user else None))
        _, events, collector = await started(session)
        end = await _turn(session, events, "what time is it")
        await session.close()
        await collector
        return session, events, end

    session, events, end = asyncio.run(scenario())
    assert "name" not in "".join(e.draft for e in events if isinstance(e, DraftUpdate))
    [called] = [e for e in events if isinstance(e, ToolCalled)]
    assert called.name == "get_time" and called.result.startswith("It is ")
    assert end.answer == f"Done: {called.result}"
    assert session.dialogue.history[1].content == call_text("get_time", "{}")
