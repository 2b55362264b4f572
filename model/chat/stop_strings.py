"""Stop strings (`GenerationOptions.stop`): where an answer ends, applied once, by the model.

The model ends an answer at the first stop string in its committed text (`end_at_stop`), so the answer stops being
computed there and its usage counts only the tokens whose text is returned. What a server shows of an answer still
being refined (model/server/answer.py) needs the same search on text the model has not committed: the guess is cut
at a stop string, and committed text that could be the start of one is held back (`stable_length`). Both use
`cut_at_stop`, so "the first stop string" means the same everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from model.chat import Draft


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` up to the earliest stop string, and whether one was found (empty stop strings never match)."""
    cut = min((index for index in (text.find(stop) for stop in stops if stop) if index >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


def stable_length(text: str, stops: Sequence[str]) -> int:
    """Length of the part of `text` that cannot become part of a stop string once more text follows it."""
    held = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:size]):
                held = size
                break
    return len(text) - held


def end_at_stop(draft: Draft, stops: Sequence[str]) -> Draft | None:
    """`draft` ended at the first stop string in its committed text (done, finish_reason "stop"), or None if it has
    none. Its usage counts only the tokens whose text it still holds."""
    committed, stopped = cut_at_stop(draft.committed_text, stops)
    if not stopped:
        return None
    keep, pieces, length = len(committed), [], 0
    for piece in draft.pieces:
        if length >= keep:
            break
        pieces.append(dataclasses.replace(piece, text=piece.text[: keep - length]))
        length += len(piece.text)
    return dataclasses.replace(
        draft, pieces=tuple(pieces), done=True, finish_reason="stop",
        completion_tokens=sum(piece.tokens for piece in pieces),
    )
