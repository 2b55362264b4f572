"""The server's view of a draft: stop strings cut the answer, committed text never has to be taken back; the model
applies them to what it commits, the view only to what it has not (model/chat/stop_strings.py)."""

from __future__ import annotations

import pytest

import model.server.answer as answer_module
from model.chat import ChatMessage, Draft, DraftPiece, GenerationOptions
from model.chat.stop_strings import cut_at_stop, end_at_stop, stable_length
from model.server.answer import view_of
from scripts.report_lib.tiny_models import scripted_byte_model


def draft(committed: str, guess: str = "", done: bool = False, finish: str | None = None) -> Draft:
    pieces = [DraftPiece(committed, True)] if committed else []
    if guess:
        pieces.append(DraftPiece(guess, False))
    return Draft(step=0, pieces=tuple(pieces), done=done, finish_reason=finish)


def test_cut_at_stop_takes_the_earliest_stop() -> None:
    assert cut_at_stop("hello. world! again", ("!", ".")) == ("hello", True)
    assert cut_at_stop("hello", ("!",)) == ("hello", False)
    assert cut_at_stop("hello", ()) == ("hello", False)


def test_stable_length_holds_back_a_possible_stop_prefix() -> None:
    assert stable_length("hello\n\nUs", ("\n\nUser",)) == len("hello")
    assert stable_length("hello\n", ("\n\nUser", "xyz")) == len("hello")
    assert stable_length("hello", ("\n\nUser",)) == len("hello")
    assert stable_length("abc", ()) == 3


def test_committed_view_grows_and_never_shrinks_across_a_stop() -> None:
    stops = ("\n\nUser",)
    first = view_of(draft("Hi there\n\n", "Us"), stops)
    assert first.committed == "Hi there"  # "\n\n" might start the stop string: held back
    assert first.text == "Hi there\n\nUs"
    # the draft the model yields once its committed text reached the stop string: ended there
    second = view_of(end_at_stop(draft("Hi there\n\nUser", " says"), stops), stops)
    assert second.stopped
    assert second.text == second.committed == "Hi there"
    assert second.committed.startswith(first.committed)


def test_held_back_text_is_released_when_it_is_not_a_stop() -> None:
    stops = ("\n\nUser",)
    assert view_of(draft("Hi\n\n"), stops).committed == "Hi"
    assert view_of(draft("Hi\n\nOK"), stops).committed == "Hi\n\nOK"


def test_stop_in_the_guess_cuts_the_draft_but_not_the_commit() -> None:
    view = view_of(draft("Hello", " world. Next"), (".",))
    assert view.text == "Hello world"
    assert view.committed == "Hello"
    assert not view.stopped


def test_done_drafts_are_committed_in_full_unless_cancelled() -> None:
    done = view_of(draft("Hello", " world", done=True, finish="length"), ())
    assert done.committed == done.text == "Hello world"
    cancelled = view_of(draft("Hello", " wor", done=True, finish="cancelled"), ())
    assert cancelled.committed == cancelled.text == "Hello"


def test_stop_strings_are_applied_once_to_committed_text_by_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model ends the answer at the stop string; the server's view searches only the text the model has not
    committed, so no committed text is searched twice."""
    model = scripted_byte_model("Hi. Then more.", block_length=4)
    options = GenerationOptions(max_new_tokens=32, stop=(".",))
    drafts = list(model.stream_chat([ChatMessage("user", "hello")], options))
    final = drafts[-1]
    assert final.done and final.finish_reason == "stop" and final.text == "Hi"
    assert final.completion_tokens == 2  # the tokens of "Hi" only
    assert all(not cut_at_stop(d.committed_text, options.stop)[1] for d in drafts)  # no stop string got through

    searched: list[str] = []

    def counting_cut(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
        searched.append(text)
        return cut_at_stop(text, stops)

    monkeypatch.setattr(answer_module, "cut_at_stop", counting_cut)
    views = [view_of(d, options.stop) for d in drafts]
    assert views[-1].stopped and views[-1].text == views[-1].committed == "Hi"
    # a draft still refining is searched once, for its guess; the finished one, which the model cut, not again
    assert searched == [d.text for d in drafts[:-1]]
    # and the view does cut the guess: a refining draft whose guess held the stop string is shown without it
    assert any("." in d.text and "." not in v.text for d, v in zip(drafts[:-1], views[:-1], strict=True))
