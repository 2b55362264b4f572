"""What one denoising pass of a diffusion LM reports to its caller.

A diffusion LM refines a whole block of answer tokens per pass. Callers (the speculative TTS, the HTTP server's
`diffusing` stream, the terminal view) need every pass, not only the final text, so the sampler yields one `Refinement`
per pass and `Draft` turns it into text pieces that carry which parts are final.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Refinement:
    """The state of the answer after one denoising pass.

    `tokens` covers the answer region generated so far (every finished block plus the active one). At committed
    positions it holds the final token; elsewhere the pass's current best guess (argmax), never the mask id, so a
    caller can always read a full draft. For masked-diffusion models a committed token never changes afterwards; for
    uniform-noise models (DiffusionGemma) positions are committed only when their block is accepted.
    """

    step: int  # pass index over the whole answer, from 0
    block: int  # index of the active block, from 0
    tokens: tuple[int, ...]
    committed: tuple[bool, ...]
    confidence: tuple[float, ...]  # probability of the token at each position, as the model saw it in this pass
    elapsed_s: float  # wall-clock time of this pass alone
    done: bool = False  # the last refinement of this answer
    finish_reason: str | None = None  # "stop" (EOS committed), "length", or "cancelled"; set when done
    eos_ids: frozenset[int] = frozenset()  # the model's end-of-sequence ids, so readers can cut the answer
    # The model's probability that the user's message ended where it did (model/decoding/end_of_turn.py); on the
    # first pass only, None where it was not computed
    end_of_turn: float | None = None

    def __post_init__(self) -> None:
        if not (len(self.tokens) == len(self.committed) == len(self.confidence)):
            raise ValueError("tokens, committed and confidence must have the same length")

    @property
    def committed_prefix(self) -> int:
        """Number of leading positions that are committed: the part of the answer that can no longer change."""
        for index, is_committed in enumerate(self.committed):
            if not is_committed:
                return index
        return len(self.committed)

    @property
    def answer_length(self) -> int:
        """Length of the answer before the first committed end-of-sequence token (or all of it)."""
        for index, token in enumerate(self.tokens):
            if token in self.eos_ids and self.committed[index]:
                return index
        return len(self.tokens)
