"""The server's view of a draft: stop strings cut the answer, committed text never has to be taken back."""

from __future__ import annotations

from model.chat import Draft, DraftPiece
from model.server.answer import cut_at_stop, stable_length, view_of


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
    second = view_of(draft("Hi there\n\nUser", " says"), stops)
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
