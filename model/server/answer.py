"""What a client may see of an answer while it is being refined: a pure core, no I/O.

The server streams two views of the same drafts. Append-only streams (plain OpenAI) may only send text that will never
change, so they send the committed prefix. `diffusing` streams send the whole current draft each time. Both must honour
`stop` sequences: the answer ends before the first stop string, and text that might turn out to be the start of a stop
string is held back from the committed view, so committed text never has to be taken back.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.chat import Draft


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """`text` up to the earliest stop string, and whether one was found."""
    cut = min((index for index in (text.find(stop) for stop in stops if stop) if index >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def stable_length(text: str, stops: tuple[str, ...]) -> int:
    """Length of the part of `text` that cannot become part of a stop string once more text follows it."""
    held = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:size]):
                held = size
                break
    return len(text) - held


@dataclass(frozen=True, slots=True)
class AnswerView:
    """One draft as a client may see it. `committed` is always a prefix of `text`."""

    text: str  # the whole current draft, cut at the first stop string
    committed: str  # the prefix that will never change (stop-safe)
    stopped: bool  # a stop string occurs in committed text: the answer is final now


def view_of(draft: Draft, stops: tuple[str, ...]) -> AnswerView:
    """The client's view of `draft`. A finished draft is committed in full (cancelled ones only up to their commit)."""
    committed, stopped = cut_at_stop(draft.committed_text, stops)
    if stopped:
        return AnswerView(text=committed, committed=committed, stopped=True)
    if draft.done:
        final = draft.committed_text if draft.finish_reason == "cancelled" else draft.text
        final, stopped = cut_at_stop(final, stops)
        return AnswerView(text=final, committed=final, stopped=stopped)
    text, _ = cut_at_stop(draft.text, stops)
    committed = committed[: min(stable_length(committed, stops), len(text))]
    if not text.startswith(committed):  # a stop string in the guess cut into the committed part
        text = committed
    return AnswerView(text=text, committed=committed, stopped=False)
