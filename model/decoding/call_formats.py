"""The ways real models write a tool call, spelled once for the grammar that holds calls to the offer
(model/decoding/grammar.py `compile_tools`) and for the reader that turns them back into calls (model/chat/tools.py
`read_calls`). No I/O, no grammar engine: patterns and strings only.

Every form wraps the same call object, `{"name": <a declared function>, "arguments": <its arguments>}` (Llama 3.x
says "parameters"; both keys are read and allowed), and differs in what surrounds it:

- `TAGGED`: `<tool_call>{...}</tool_call>`: Qwen2.5/Qwen3 and Hermes-style templates, and this runtime's generic
  format (model/chat/tools.py), which every chat's history is written in;
- `FENCED`: the object in a Markdown code fence (```` ```json ... ``` ````), as small models write it;
- `BARE`: the object alone, as small models and Llama 3.x's JSON tool calling write it;
- `PYTHON_TAG`: Llama 3.x's `<|python_tag|>` special token, then the object: only for a tokenizer that has the token.

A form counts as a call only at the start of the answer (after at most `GAP` whitespace), and only once its trigger
is complete: `<tool_call>` or `<|python_tag|>`, or an object whose first key is "name". Text that merely holds JSON
further in, or an object with other keys (`{"answer": 42}`), stays text. Several calls follow one another in the same
form, with whitespace between.

The patterns are written in the common subset of Python's `re` and Rust's `regex` (llguidance's), so the grammar and
the reader cannot disagree on what a call looks like.
"""

from __future__ import annotations

import enum

# Whitespace around a call (Qwen writes `<tool_call>\n{...}\n</tool_call>`): bounded, so a model cannot spend its
# budget on newlines between calls.
GAP_MAX = 8
GAP = rf"[ \t\r\n]{{0,{GAP_MAX}}}"
# Whitespace inside the call object and its arguments: at most one space where JSON allows whitespace (`{"name":
# "get_time", "arguments": {"zone": "CET"}}` as models write it, or compact as the generic format writes it).
SPACE = " ?"
ARGUMENT_KEYS = ("arguments", "parameters")
TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"
FENCE_OPEN, FENCE_CLOSE = "```[a-z]*", "```"  # the opening fence may name a language (```json)
PYTHON_TAG = "<|python_tag|>"
# An object whose first key is "name": the trigger of the forms without a tag of their own.
OBJECT_HEAD = r'\{' + GAP + r'"name"'


class CallForm(enum.Enum):
    """How a model surrounds its call object (see the module's docstring)."""

    TAGGED = "tagged"
    FENCED = "fenced"
    BARE = "bare"
    PYTHON_TAG = "python_tag"

    @property
    def opener(self) -> str:
        """The pattern of what comes before the call object, as the answer's text spells it ("" for `BARE`)."""
        return {CallForm.TAGGED: TAG_OPEN, CallForm.FENCED: FENCE_OPEN, CallForm.BARE: "",
                CallForm.PYTHON_TAG: r"<\|python_tag\|>"}[self]

    @property
    def head(self) -> str:
        """The pattern from the start of a call (its leading whitespace excluded) up to the object's "name" key."""
        return self.opener + (GAP if self.opener else "") + OBJECT_HEAD

    @property
    def trigger(self) -> str:
        """The pattern whose presence at the start of an answer makes it a call of this form (the grammar then holds
        the rest to the offer): a tag of its own, else the object's head (a code fence alone is text: answers show
        code in fences)."""
        return self.opener if self in (CallForm.TAGGED, CallForm.PYTHON_TAG) else self.head

    @property
    def close(self) -> str:
        """The literal after the call object (none for the bare forms)."""
        return {CallForm.TAGGED: TAG_CLOSE, CallForm.FENCED: FENCE_CLOSE}.get(self, "")


# What every model is held to: the generic format, and the two forms small models fall back to.
DEFAULT_FORMS = (CallForm.TAGGED, CallForm.FENCED, CallForm.BARE)
# The first characters of the forms spelled in text: an answer that starts with one may be a call (the speech guard
# leaves such answers alone: their names and arguments must copy the offer and the user's words).
OPENING_CHARACTERS = ("<", "{", "`")


def forms_for(special_tokens: frozenset[str]) -> tuple[CallForm, ...]:
    """The forms a model with these special tokens may write: `PYTHON_TAG` where the vocabulary has Llama 3.x's
    token (the grammar can only name a token the tokenizer has), the default forms always."""
    return (*DEFAULT_FORMS, CallForm.PYTHON_TAG) if PYTHON_TAG in special_tokens else DEFAULT_FORMS
