"""The dialogue's history window: bounded by the budget, dropped in large steps so that consecutive prompts share
their start (what the LM's cache holds), the same for a replayed copy, and at most `max_exchanges` earlier exchanges."""

from __future__ import annotations

from itertools import pairwise

import pytest

from model.chat import ChatMessage
from voice.think.dialogue import Dialogue, DialogueConfig, window_start


def talk(dialogue: Dialogue, turns: int) -> list[list[ChatMessage]]:
    """`turns` exchanges (40-char questions, 80-char answers, all different); what the model was sent each turn."""
    sent = []
    for turn in range(turns):
        dialogue.add_user(f"{turn:03d}".ljust(40, "u"))
        sent.append(dialogue.messages())
        dialogue.add_assistant(f"{turn:03d}".ljust(80, "a"))
    return sent


def chars(messages: list[ChatMessage]) -> int:
    return sum(len(m.content) for m in messages if m.role != "system")


def test_window_stays_within_the_budget_and_opens_with_the_user() -> None:
    sent = talk(Dialogue(DialogueConfig(context_chars=600, max_exchanges=None)), 40)
    for messages in sent:
        assert chars(messages) <= 600
        assert messages[0].role == "user" and messages[-1].role == "user"


def test_most_prompts_extend_the_previous_one() -> None:
    sent = talk(Dialogue(DialogueConfig(context_chars=1200, keep_after_drop=0.5, max_exchanges=None)), 60)
    extends = sum(1 for before, after in pairwise(sent) if after[: len(before)] == before)
    drops = len(sent) - 1 - extends
    # 120 chars an exchange: a drop frees ~600 chars, i.e. one drop every ~5 turns once the budget is reached
    assert 8 <= drops <= 12
    assert extends >= 47


def test_dropping_one_exchange_at_a_time_breaks_the_prefix_every_turn() -> None:
    # keep_after_drop=1.0 is the old policy: the comparison the large steps are measured against
    sent = talk(Dialogue(DialogueConfig(context_chars=1200, keep_after_drop=1.0, max_exchanges=None)), 30)
    late = list(pairwise(sent[15:]))
    extends = sum(1 for before, after in late if after[: len(before)] == before)
    assert extends == 0, extends


def test_after_a_drop_at_most_the_low_watermark_remains() -> None:
    dialogue = Dialogue(DialogueConfig(context_chars=1200, keep_after_drop=0.5, max_exchanges=None))
    sent = talk(dialogue, 30)
    shrunk = [after for before, after in pairwise(sent) if chars(after) < chars(before)]
    assert shrunk and all(chars(messages) <= 600 for messages in shrunk)


def test_a_replayed_copy_sends_the_same_prompt() -> None:
    # the session's early LM start rebuilds a copy from `history`: its prompt must be what the real one will send
    real = Dialogue(DialogueConfig(context_chars=900, max_exchanges=None))
    talk(real, 23)
    copy = Dialogue(real.config)
    for message in real.history:
        (copy.add_user if message.role == "user" else copy.add_assistant)(message.content)
    real.add_user("next question")
    copy.add_user("next question")
    assert copy.messages() == real.messages()


def test_newest_message_kept_even_when_it_alone_exceeds_the_budget() -> None:
    dialogue = Dialogue(DialogueConfig(context_chars=100, max_exchanges=None))
    talk(dialogue, 3)
    dialogue.add_user("x" * 500)
    assert dialogue.messages() == [ChatMessage("user", "x" * 500)]


def test_the_dialogue_holds_no_system_message() -> None:
    # the system prompt is the request's (GenerationOptions.system_prompt), which the model puts first
    sent = talk(Dialogue(DialogueConfig(context_chars=300, max_exchanges=None)), 10)
    assert all(message.role != "system" for messages in sent for message in messages)


def test_window_start_pure_function() -> None:
    turns = [ChatMessage("user" if i % 2 == 0 else "assistant", "x" * 100) for i in range(9)]
    assert window_start(turns, 1000, 0.5) == 0
    # message 5 brings 600 chars: messages 0-3 go (down to 200, not opening with the assistant), then 6-8 fit in 500
    assert window_start(turns, 500, 0.5) == 4


def test_by_default_the_model_sees_the_previous_exchange_only() -> None:
    dialogue = Dialogue()
    sent = talk(dialogue, 6)
    assert [m.content[:3] for m in sent[0]] == ["000"]
    for turn, messages in enumerate(sent[1:], 1):
        assert [m.role for m in messages] == ["user", "assistant", "user"]
        assert [m.content[:3] for m in messages] == [f"{turn - 1:03d}"] * 2 + [f"{turn:03d}"]


def test_exchange_cap_of_two_and_zero() -> None:
    two = talk(Dialogue(DialogueConfig(max_exchanges=2)), 5)[-1]
    assert [m.content[:3] for m in two] == ["002", "002", "003", "003", "004"]
    none = talk(Dialogue(DialogueConfig(max_exchanges=0)), 5)[-1]
    assert [m.content[:3] for m in none] == ["004"]


BAD_CONFIGS = [{"context_chars": 0}, {"keep_after_drop": 1.5}, {"keep_after_drop": -0.1}, {"max_exchanges": -1}]


@pytest.mark.parametrize("bad", BAD_CONFIGS)
def test_bad_config_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DialogueConfig(**bad)  # type: ignore[arg-type]
