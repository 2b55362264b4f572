"""What a caller asks of one answer: `GenerationOptions` and its `AnswerRules`, one object from the session or the API
to the step objects that decode it.

It sits in decoding/ because the step objects read it (temperature, seed, the rules their guard applies) and the chat
layer above re-exports it as part of its contract (`model.chat`). Sampler details (block length, threshold) are the
model's own, in `SamplerConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from model.decoding.call_formats import DEFAULT_FORMS, CallForm
from model.errors import ModelError


@dataclass(frozen=True, slots=True)
class AnswerRules:
    """Edits of the teacher's logits that one caller may ask of its answer; every rule is off (0) by default.

    They are a caller's policy, not the model's: a voice pipeline wants answers a listener can follow (no loops, an end
    soon after a sentence), an API client wants what it asked for. The model applies them identically in every
    decoding mode (`model.decoding.speech_guard.SpeechGuard`), so they never make decoding modes disagree.
    """

    no_repeat_ngram: int = 0  # never repeat an n-gram of words of the answer, as a listener hears it
    end_after: int = 0  # once the answer holds this many tokens, end it at the next sentence end
    no_copy_ngram: int = 0  # never copy a run of n tokens (words and punctuation) from the prompt
    no_copy_opening: int = 0  # never open with the first n tokens of an earlier answer in the prompt

    def __post_init__(self) -> None:
        if min(self.no_repeat_ngram, self.end_after, self.no_copy_ngram, self.no_copy_opening) < 0:
            raise ModelError("no_repeat_ngram, no_copy_ngram, no_copy_opening and end_after must be >= 0 (0: off)")

    @property
    def active(self) -> bool:
        return bool(self.no_repeat_ngram or self.end_after or self.no_copy_ngram or self.no_copy_opening)


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """The structure a caller demands of its answer, enforced by constrained decoding (model/decoding/grammar.py).

    `json_object`: any JSON object; `json_schema`: JSON matching `schema`, kept as compact JSON text (no spaces, keys in
    the caller's order, which is the order the answer writes properties in) so the options stay frozen and hashable.
    """

    kind: Literal["json_object", "json_schema"]
    schema: str | None = None  # compact JSON of the schema; only for json_schema
    name: str = ""  # the schema's name, as the caller gave it (for messages)

    def __post_init__(self) -> None:
        if (self.kind == "json_schema") != (self.schema is not None):
            raise ModelError("a json_schema response format needs a schema, and only it takes one")


@dataclass(frozen=True, slots=True)
class ToolConstraint:
    """The tool calls a caller demands (or allows) as its answer, enforced by constrained decoding like a
    `ResponseFormat`: each call is `{"name":...,"arguments":...}` in one of `forms` (model/decoding/call_formats.py)
    naming one of `tools`, its arguments matching that function's parameters schema.

    `required`: the answer is one call (or, with `parallel`, one or more) from its first token; otherwise ("auto") it
    is free text unless it opens with a call's trigger, from which on it is such calls. Schemas are compact JSON text,
    so the options stay frozen and hashable. `forms` are the model's (the engine sets them from its tokenizer).
    """

    tools: tuple[tuple[str, str], ...]  # (function name, compact JSON of its parameters schema)
    required: bool
    parallel: bool = True
    forms: tuple[CallForm, ...] = DEFAULT_FORMS

    def __post_init__(self) -> None:
        if not self.tools:
            raise ModelError("a tool constraint needs at least one function")


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    """What a caller may ask of one answer. Sampler details (block length, threshold) belong to the model's config."""

    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = argmax; > 0 = sampling (Gumbel-max in float64 for diffusion)
    seed: int | None = None  # same seed, same output
    stop: tuple[str, ...] = ()
    # A voice turn someone is waiting to hear: a model that batches answers starts it ahead of bulk (API) work.
    interactive: bool = False
    # Tokens at the head of the answer that a self-speculative decoding drafts whatever its draft policy chooses (at
    # most the model's `draft_masks` a pass), where the policy finds draft rows nearly free (`DraftPolicy.lead_pays`).
    # A voice answer's first phrase is rendered from its drafts (voice/speak/speculator.py) while its words are
    # verified and the end of turn is confirmed: there a draft buys time to first audio, which the policy's tokens
    # per ms do not count. 0: the policy decides every pass. An interactive answer's passes up to these tokens also
    # run on a wider team of threads where the cores are spare (model/runtime/batch_runner.py `_team`).
    draft_lead: int = 0
    # The conversation this answer continues (a voice session's id): a model that batches answers keeps its cache
    # slot for it, so other conversations never overwrite what it encoded ahead.
    conversation: str | None = None
    # The system message of a chat that has none (None: the model's own default, if it has one).
    system_prompt: str | None = None
    # Logit rules of this caller (all off by default: an API client gets the model's plain answer).
    rules: AnswerRules = AnswerRules()
    # The structure the answer must have (None: free text).
    response_format: ResponseFormat | None = None
    # The tool calls the answer must (or may) be (None: no tools). Exclusive with `response_format`.
    tools: ToolConstraint | None = None

    def check(self) -> None:
        """Refuse (`ModelError`) what no decoding can do; called when an answer is asked for, so a server maps it to
        the request's error rather than failing where the options were built."""
        if self.max_new_tokens < 1:
            raise ModelError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ModelError(f"temperature must be >= 0, got {self.temperature}")
        if self.draft_lead < 0:
            raise ModelError(f"draft_lead must be >= 0, got {self.draft_lead}")
        if self.tools is not None and self.response_format is not None:
            raise ModelError("an answer takes tool calls or a response_format, not both")


# The options of a caller that asks for nothing: the model's plain greedy answer.
PLAIN = GenerationOptions()


def whole_blocks(tokens: int, block_length: int) -> int:
    """`tokens` rounded up to whole blocks: the length every decoding mode gives an answer of at most `tokens`."""
    return -(-max(tokens, 1) // block_length) * block_length
