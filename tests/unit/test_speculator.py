"""The phrase speculator on hand-made draft sequences: hit, miss, change after render, end, cancel, speculation off."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.chat import Draft, DraftPiece
from model.decoding.refinement import Refinement
from voice.speak.speculator import (
    Commit,
    Discard,
    PhraseSpeculator,
    Render,
    SpeculatorConfig,
    split_phrases,
)

ANSWER = ["Hello", " there", ",", " my", " friend", ".", " How", " are", " you", "?"]


def draft(step: int, committed: list[str], guess: list[str], confidence: float = 0.9, **kwargs: object) -> Draft:
    pieces = [DraftPiece(text, True) for text in committed] + [DraftPiece(text, False, confidence) for text in guess]
    return Draft(step=step, pieces=tuple(pieces), **kwargs)  # type: ignore[arg-type]


def done(step: int, tokens: list[str], reason: str = "stop") -> Draft:
    return draft(step, tokens, [], done=True, finish_reason=reason)


def run(speculator: PhraseSpeculator, drafts: list[Draft]) -> list[list[object]]:
    return [speculator.feed(d) for d in drafts]


def test_stable_draft_is_rendered_then_committed_with_the_same_text() -> None:
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=2))
    steps = run(speculator, [
        draft(0, [], ANSWER),
        draft(1, ANSWER[:3], ANSWER[3:]),
        draft(2, ANSWER[:6], ANSWER[6:]),
        draft(3, ANSWER[:7], ANSWER[7:]),
    ])  # fmt: skip
    assert steps[0] == []  # seen once: not yet stable
    assert steps[1] == [Render(0, "Hello there, my friend.")]
    assert steps[2] == []  # "friend." committed but the whitespace after it is not: the boundary may still move
    assert steps[3] == [Commit(0, "Hello there, my friend.")]
    assert speculator.committed_phrases == ("Hello there, my friend.",)


def test_changed_draft_is_discarded_and_committed_with_the_final_text() -> None:
    wrong = ["Hello", " there", ",", " my", " pal", ".", " How", " are", " you", "?"]
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=2))
    steps = run(speculator, [
        draft(0, [], wrong),
        draft(1, [], wrong),
        draft(2, ANSWER[:4], ANSWER[4:]),
        draft(3, ANSWER[:7], ANSWER[7:]),
    ])  # fmt: skip
    assert steps[1] == [Render(0, "Hello there, my pal.")]
    assert steps[2] == [Discard(0)]  # "friend" replaced "pal": the render is wrong
    assert steps[3] == [Commit(0, "Hello there, my friend.")]


def test_phrase_changed_after_render_is_rendered_again_once_stable() -> None:
    wrong = ["Hello", " there", ",", " my", " pal", ".", " How"]
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=2))
    steps = run(speculator, [
        draft(0, [], wrong),
        draft(1, [], wrong),
        draft(2, [], ANSWER),
        draft(3, [], ANSWER),
        draft(4, ANSWER[:7], ANSWER[7:]),
    ])  # fmt: skip
    assert steps[1] == [Render(0, "Hello there, my pal.")]
    assert steps[2] == [Discard(0)]
    assert steps[3] == [Render(0, "Hello there, my friend.")]
    assert steps[4] == [Commit(0, "Hello there, my friend.")]


def test_end_of_answer_commits_the_tail_without_trailing_space() -> None:
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=1))
    steps = run(speculator, [draft(0, ANSWER[:7], ANSWER[7:]), done(1, ANSWER)])
    assert Commit(0, "Hello there, my friend.") in steps[0]
    assert steps[1] == [Commit(1, "How are you?")]
    assert speculator.finished
    assert speculator.finish() == []


def test_cancelled_answer_commits_no_tail_and_discards_outstanding_renders() -> None:
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=1, max_ahead=2))
    first = run(speculator, [draft(0, ANSWER[:2], [*ANSWER[2:], " Bye", "."])])[0]
    assert Render(0, "Hello there, my friend.") in first and Render(1, "How are you?") in first
    cancelled = speculator.feed(draft(1, ANSWER[:8], [], done=True, finish_reason="cancelled"))
    # Only the closed, committed phrase is final; "How are" was cut off and is never spoken.
    assert cancelled == [Commit(0, "Hello there, my friend."), Discard(1)]


def test_finish_without_done_draft_commits_committed_tail_only() -> None:
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=1))
    assert Commit(0, "Hello there, my friend.") in speculator.feed(draft(0, ANSWER[:8], ANSWER[8:]))
    assert speculator.finish() == [Commit(1, "How are")]  # the uncommitted guess " you?" is never spoken


def test_speculation_off_gives_the_same_commits_and_no_renders() -> None:
    drafts = [draft(0, [], ANSWER), draft(1, [], ANSWER), draft(2, ANSWER[:7], ANSWER[7:]), done(3, ANSWER)]
    on = [a for step in run(PhraseSpeculator(SpeculatorConfig(stable_passes=1)), drafts) for a in step]
    off = [a for step in run(PhraseSpeculator(SpeculatorConfig(enabled=False)), drafts) for a in step]
    assert any(isinstance(a, Render) for a in on)
    assert off == [a for a in on if isinstance(a, Commit)]


def test_low_confidence_draft_is_not_rendered() -> None:
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=1, min_confidence=0.5, first_min_confidence=0.5))
    assert speculator.feed(draft(0, [], ANSWER, confidence=0.2)) == []
    assert speculator.feed(draft(1, [], ANSWER, confidence=0.7)) == [Render(0, "Hello there, my friend.")]


def test_the_first_phrase_is_rendered_at_a_lower_confidence_than_the_others() -> None:
    # the first phrase's audio is what the user waits for: a wrong render costs CPU, a late one costs latency
    tokens = [*ANSWER, " Fine", "."]
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=1, min_confidence=0.5, first_min_confidence=0.1))
    assert speculator.feed(draft(0, [], tokens, confidence=0.2)) == [Render(0, "Hello there, my friend.")]
    assert speculator.feed(draft(1, tokens[:7], tokens[7:], confidence=0.2)) == [Commit(0, "Hello there, my friend.")]
    assert speculator.feed(draft(2, tokens[:7], tokens[7:], confidence=0.6)) == [Render(1, "How are you?")]


def test_render_only_max_ahead_phrases() -> None:
    tokens = ["One", ".", " Two", ".", " Three", ".", " Four"]
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=1, max_ahead=2))
    assert speculator.feed(draft(0, [], tokens)) == [Render(0, "One."), Render(1, "Two.")]
    assert speculator.feed(draft(1, tokens[:3], tokens[3:])) == [Commit(0, "One."), Render(2, "Three.")]


def test_no_cut_inside_number_or_after_abbreviation() -> None:
    config = SpeculatorConfig(first_phrase_words=0)
    # "3." followed by an uncommitted guess: no boundary yet, whatever comes next.
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=1, first_phrase_words=0))
    assert speculator.feed(draft(0, ["It", " is", " 3", "."], ["5", " now", "."])) == []
    spans, _ = split_phrases("It is 3.5 now. Ask Dr. Smith, e.g. today. U.S. law. So did I. ", config, final=False)
    assert [s.text for s in spans] == ["It is 3.5 now.", "Ask Dr. Smith,", "e.g. today.", "U.S. law.", "So did I."]


def test_first_phrase_word_budget_cuts_early_but_not_after_a_number() -> None:
    config = SpeculatorConfig(first_phrase_words=4)
    spans, _ = split_phrases("I think that the answer is yes and more ", config, final=False)
    # not after "the", which leans on the next word; later phrases wait for punctuation
    assert [s.text for s in spans] == ["I think that the answer"]
    spans, _ = split_phrases("It costs about 3 million dollars today ", config, final=False)
    assert spans[0].text == "It costs about 3 million"
    spans, _ = split_phrases("The capital of France is Paris. ", SpeculatorConfig(first_phrase_words=3), final=False)
    assert [s.text for s in spans] == ["The capital of France", "is Paris."]


def test_short_clause_is_not_cut_but_sentence_and_line_are() -> None:
    config = SpeculatorConfig(first_phrase_words=0, min_clause_words=3)
    spans, tail = split_phrases("Yes, I can. Sure thing\n1. First item\nlast", config, final=False)
    assert [s.text for s in spans] == ["Yes, I can.", "Sure thing", "1. First item"]
    assert tail == len("Yes, I can. Sure thing\n1. First item")


def test_eos_guess_makes_the_last_phrase_renderable_but_not_committable() -> None:
    tokens = ["Sure", "!", " Here", " you", " go", "."]
    refinement = Refinement(step=0, block=0, tokens=(1, 2, 3, 4, 5, 6, 0), committed=(True,) * 2 + (False,) * 5,
                            confidence=(0.9,) * 7, elapsed_s=0.01, eos_ids=frozenset({0}))
    speculator = PhraseSpeculator(SpeculatorConfig(stable_passes=1))
    actions = speculator.feed(draft(0, tokens[:2], tokens[2:], refinement=refinement))
    assert actions == [Render(0, "Sure!"), Render(1, "Here you go.")]
    # All committed, but only the done draft says nothing follows "go.".
    assert speculator.feed(draft(1, tokens, [], refinement=refinement)) == [Commit(0, "Sure!")]
    assert speculator.feed(done(2, tokens)) == [Commit(1, "Here you go.")]


VOCAB = ["Hello", " there", ",", " 3", ".", "5", " Dr", " Smith", "!", " ok", "\n", " yes", "?", " e.g", " a", " b"]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    final=st.lists(st.sampled_from(VOCAB), min_size=1, max_size=24),
    data=st.data(),
    config=st.builds(SpeculatorConfig, enabled=st.booleans(), stable_passes=st.integers(1, 3),
                     min_confidence=st.floats(0.0, 1.0), first_phrase_words=st.integers(0, 5),
                     min_clause_words=st.integers(1, 4), max_ahead=st.integers(1, 3)),
)
def test_commits_are_only_ever_committed_text(final: list[str], data: st.DataObject, config: SpeculatorConfig) -> None:
    """Over random answers, commit schedules and guesses: every Commit is the next phrase of the committed text at
    that moment, renders are never for committed phrases, and the commits of a finished answer are its phrases."""
    speculator = PhraseSpeculator(config)
    committed_count = 0
    outstanding: set[int] = set()
    commits: list[str] = []
    for step in range(2 * len(final)):
        committed_count = min(len(final), committed_count + data.draw(st.integers(0, 3)))
        guess_len = data.draw(st.integers(0, len(final) - committed_count + 2))
        guess = data.draw(st.lists(st.sampled_from(VOCAB), min_size=guess_len, max_size=guess_len))
        confidence = data.draw(st.floats(0.0, 1.0))
        committed_text = "".join(final[:committed_count])
        for action in speculator.feed(draft(step, final[:committed_count], guess, confidence)):
            if isinstance(action, Commit):
                assert action.phrase_id == len(commits)
                commits.append(action.text)
                spoken = " ".join(" ".join(commits).split())
                assert " ".join(committed_text.split()).startswith(spoken)
                outstanding.discard(action.phrase_id)
            elif isinstance(action, Render):
                assert config.enabled and action.phrase_id >= len(commits)
                outstanding.add(action.phrase_id)
            else:
                assert action.phrase_id in outstanding
                outstanding.remove(action.phrase_id)
    for action in speculator.feed(done(len(final) * 2, final)):
        if isinstance(action, Commit):
            assert action.phrase_id == len(commits)
            commits.append(action.text)
        elif isinstance(action, Discard):
            outstanding.remove(action.phrase_id)
    final_text = "".join(final)
    assert commits == [s.text for s in split_phrases(final_text, config, final=True)[0]]
    assert " ".join(commits).split() == final_text.split()


def test_engine_drafts_with_a_character_split_across_tokens_never_feed_half_a_character() -> None:
    from model.chat import ChatMessage, GenerationOptions
    from scripts.report_lib.tiny_models import scripted_byte_model

    answer = "Café au lait, très bien. Merci beaucoup!"  # "é" straddles the end of the first block of 4
    actions: list[object] = []
    for block_length, eos_ahead in ((4, False), (8, True)):  # block ends; end-of-sequence guesses after each token
        model = scripted_byte_model(answer, block_length=block_length, eos_ahead=eos_ahead)
        config = SpeculatorConfig(stable_passes=1, min_confidence=0.0)
        speculator = PhraseSpeculator(config)
        for draft in model.stream_chat([ChatMessage("user", "hi")], GenerationOptions(max_new_tokens=64)):
            actions.extend(speculator.feed(draft))
        phrases = tuple(span.text for span in split_phrases(answer, config, final=True)[0])
        assert speculator.committed_phrases == phrases and phrases[0] == "Café au lait,"
    texts = [action.text for action in actions if isinstance(action, Render | Commit)]
    assert any(isinstance(action, Render) for action in actions)
    assert not [text for text in texts if "\ufffd" in text]  # nothing half-decoded ever reaches the voice
