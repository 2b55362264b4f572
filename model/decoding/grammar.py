"""Constrained decoding: a `ResponseFormat` as a per-answer `Grammar` that masks the teacher's logits.

The grammar engine is llguidance (a JSON schema compiled to a token-level parser over the model's vocabulary); this
module is the only one that knows it. A `Grammar` is one answer's parser state: `mask` a row of logits for the token
after what it has consumed, `advance` through tokens, `rollback` what a pass did not keep. The self-speculative mode
masks each verification row with the state after that row's own prefix (`constrain_rows`), so a draft the grammar
refuses is simply not accepted and answers equal constrained autoregressive ones token for token. Diffusion decoding
proposes a block's masked positions in order, each masked with the state after the proposals before it, and commits
left to right (model/decoding/sampler.py `grammar_proposal`).

JSON is compiled without free whitespace (`{"a":1}`): a small model offered optional spaces and newlines can spend
its whole budget on them, and compact JSON is what a program parses anyway.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from typing import Any

import llguidance
import llguidance.hf
import torch

from model.decoding.call_formats import ARGUMENT_KEYS, GAP, OBJECT_HEAD, PYTHON_TAG, SPACE, CallForm
from model.decoding.options import ResponseFormat, ToolConstraint
from model.errors import ModelError

# Compiler options under the schema's own "x-guidance" (a caller may still ask for flexible whitespace there).
_JSON_DEFAULTS: llguidance.JsonCompileOptions = {"whitespace_flexible": False}
_ANY_OBJECT = '{"type":"object"}'
# A call's arguments: at most one space where JSON allows whitespace, as models write calls (`{"zone": "CET"}`)
_CALL_JSON: llguidance.JsonCompileOptions = {"whitespace_flexible": True, "whitespace_pattern": SPACE}

# JSON Schema's keywords (2020-12, draft-7's, OpenAPI's "discriminator" hint) by what their value holds, so
# `unknown_keyword` can walk a schema: a keyword outside them is refused (a typo such as "maxLenght" would otherwise
# be ignored, as the standard ignores unknown keywords, and the answer left unconstrained where the caller meant a
# rule). Standard keywords llguidance cannot enforce ("uniqueItems", "not", ...) are refused by llguidance itself.
_ONE_SCHEMA = frozenset({"additionalProperties", "not", "contains", "propertyNames", "additionalItems", "if", "then",
                         "else", "unevaluatedItems", "unevaluatedProperties", "contentSchema", "items"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems", "items"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_VALUES = frozenset({
    "type", "enum", "const", "default", "examples", "required", "format", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength", "minItems", "maxItems",
    "uniqueItems", "minContains", "maxContains", "minProperties", "maxProperties", "dependentRequired",
    "dependencies", "$schema", "$id", "id", "$anchor", "$comment", "$ref", "$dynamicRef", "$dynamicAnchor",
    "$recursiveRef", "$recursiveAnchor", "$vocabulary", "title", "description", "deprecated", "readOnly",
    "writeOnly", "contentEncoding", "contentMediaType", "discriminator", "x-guidance",
})


class GrammarError(ModelError):
    """A response format the grammar engine refuses: malformed JSON, an unknown type, a keyword it cannot enforce."""


def response_format(kind: str, schema: Any = None, name: str = "") -> ResponseFormat:
    """A `ResponseFormat` with its schema as compact JSON text (a dict from a request, or JSON text). Keys keep their
    order: the grammar writes an object's properties in the schema's order."""
    if kind == "json_object":
        return ResponseFormat("json_object", name=name)
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise GrammarError(f"the JSON schema is not valid JSON: {error}") from error
    if not isinstance(schema, dict):
        raise GrammarError("the JSON schema must be a JSON object")
    return ResponseFormat("json_schema", json.dumps(schema, separators=(",", ":")), name)


def unknown_keyword(schema: Any, where: str = "#") -> str | None:
    """The first keyword of `schema` (or of a schema inside it) that is not JSON Schema's, as "name at path"."""
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        path = f"{where}/{key}"
        if key.startswith("x-"):
            continue
        if key not in _ONE_SCHEMA | _SCHEMA_LISTS | _SCHEMA_MAPS | _VALUES:
            return f"{key!r} at {where}"
        if key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool):
            return f"{key!r} at {where} as a boolean (draft 4; since draft 6 it is the bound itself)"
        inner: list[tuple[Any, str]] = []
        if key in _ONE_SCHEMA and isinstance(value, dict):
            inner = [(value, path)]
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            inner = [(item, f"{path}/{i}") for i, item in enumerate(value)]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            inner = [(item, f"{path}/{name}") for name, item in value.items()]
        for item, item_path in inner:
            found = unknown_keyword(item, item_path)
            if found:
                return found
    return None


# A format is compiled where the server checks a request and again where the engine plans its answer, and a tool's
# schema once alone (to name the function it refuses) and once inside the tool grammar: one compile serves them all.
# Options are frozen and hashable; a refused format raises, and exceptions are not cached.
COMPILED_KEPT = 256


@functools.lru_cache(maxsize=COMPILED_KEPT)
def compile_format(fmt: ResponseFormat) -> str:
    """The llguidance grammar of `fmt`, validated (`GrammarError` naming what the engine refused). Needs no
    tokenizer, so a server checks a request's format before it queues the answer."""
    unknown = unknown_keyword(json.loads(fmt.schema)) if fmt.schema else None
    if unknown:
        raise GrammarError(f"the JSON schema uses a keyword the engine does not know: {unknown}")
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(fmt.schema or _ANY_OBJECT, defaults=_JSON_DEFAULTS)
    except ValueError as error:
        raise GrammarError(f"the JSON schema is not valid: {error}") from error
    message = llguidance.LLMatcher.validate_grammar(grammar)
    if message:
        raise GrammarError(f"the JSON schema cannot be enforced: {message}")
    return grammar


@functools.lru_cache(maxsize=COMPILED_KEPT)
def compile_tools(constraint: ToolConstraint) -> str:
    """The llguidance (Lark) grammar of `constraint`'s tool calls, validated like `compile_format` (each function's
    parameters schema first, so an error names the function).

    Each call form (model/decoding/call_formats.py) is a rule whose first lexeme is lazy and runs from the answer's
    start through its trigger to the object's "name" key; after it come a declared name and that function's
    arguments, then the form's end. "auto" adds free text as the other alternative: one lexeme whose language is
    every text that does not open with a trigger. The two are alive together while the answer could still be either
    (`{`, `<tool_`), so the grammar is dormant for free text, and from the byte that completes a trigger on it holds
    the answer to the offer: llama.cpp's lazy grammar, in one parser, with no switch for decoding modes to agree on.
    """
    functions = []
    for i, (name, parameters) in enumerate(constraint.tools):
        try:
            compile_format(ResponseFormat("json_schema", parameters, name))
        except GrammarError as error:
            raise GrammarError(f"function {name!r}: {error}") from error
        arguments = {**json.loads(parameters), "x-guidance": _CALL_JSON}
        functions += [f"fn_{i}: {_literal(json.dumps(name))} SPACE \",\" SPACE KEY SPACE \":\" SPACE args_{i}",
                      f"args_{i}: %json {json.dumps(arguments, separators=(',', ':'))}"]
    names = " | ".join(f"fn_{i}" for i in range(len(constraint.tools)))
    forms, heads = [], []
    for form in constraint.forms:
        rule = form.value
        close = f" GAP {_literal(form.close)}" if form.close else ""
        if form is CallForm.PYTHON_TAG:  # a special token, which only a rule (not a lexeme) can name
            heads += [f"{rule}_head[lazy]: /{GAP}{OBJECT_HEAD}/", f"{rule}: {PYTHON_TAG} {rule}_head call{close}"]
            forms.append(f"{rule}+" if constraint.parallel else rule)
            continue
        heads += [f"{rule}_head[lazy]: /{GAP}{form.head}/", f"{rule}: {rule}_head call{close}"]
        if constraint.parallel:
            # A further call follows with nothing between: whitespace after a call ends the answer, so a model
            # that writes a newline after its call (SmolLM2 does) is not then held to write another
            heads += [f"{rule}_next_head[lazy]: /{form.head}/", f"{rule}_next: {rule}_next_head call{close}"]
            forms.append(f"{rule} {rule}_next*")
        else:
            forms.append(rule)
    lines = ["%llguidance {}", f"start: {'calls' if constraint.required else 'calls | TEXT'}",
             f"calls: ({' | '.join(forms)}) GAP",
             f'call: SPACE ":" SPACE ({names}) SPACE "}}"', *heads, *functions,
             "KEY: " + " | ".join(_literal(json.dumps(key)) for key in ARGUMENT_KEYS),
             f"GAP: /{GAP}/", f"SPACE: /{SPACE}/"]
    if not constraint.required:
        triggers = "|".join(form.trigger for form in constraint.forms if form is not CallForm.PYTHON_TAG)
        lines.append(f"TEXT: /(?s:.*)/ & ~/{GAP}({triggers})(?s:.*)/")
    grammar = llguidance.grammar_from("lark", "\n".join(lines) + "\n")
    message = llguidance.LLMatcher.validate_grammar(grammar)
    if message:
        raise GrammarError(f"the tool call grammar cannot be enforced: {message}")
    return grammar


def _literal(text: str) -> str:
    """`text` as a Lark string literal."""
    return json.dumps(text)


def grammar_tokenizer(tokenizer: Any, eos_ids: Iterable[int]) -> llguidance.LLTokenizer:
    """llguidance's view of a Hugging Face fast tokenizer (~1 s for SmolLM2's 49k tokens: build it once per model).
    `eos_ids` are the tokens that end an answer: the grammar allows them only where its JSON is complete."""
    try:
        return llguidance.hf.from_tokenizer(tokenizer, eos_token=sorted(eos_ids))
    except ValueError as error:  # a slow (Python) tokenizer
        raise GrammarError(f"this model's tokenizer cannot be constrained: {error}") from error


class Grammar:
    """One answer's parser state over the vocabulary of `tokenizer`."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str) -> None:
        self._matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        self._vocab = tokenizer.vocab_size
        self._check()

    def _check(self) -> None:
        if self._matcher.is_error():
            raise GrammarError(f"the grammar engine failed: {self._matcher.get_error()}")

    @property
    def complete(self) -> bool:
        """The structure is closed: only an end-of-answer token may follow."""
        return self._matcher.is_stopped()

    def allowed(self) -> torch.Tensor:
        """[vocab] bool: the tokens the grammar allows next."""
        bias = torch.frombuffer(bytearray(self._matcher.compute_logit_bias()), dtype=torch.uint8)
        self._check()
        return bias != 0

    def mask(self, logits: torch.Tensor, fallback: torch.Tensor | None = None) -> None:
        """Set every token the grammar refuses next to -inf in `logits` ([V], in place; columns past the tokenizer's
        vocabulary, such as the mask id's, are refused). When nothing is left (other rules banned every token the
        grammar allows), the grammar wins: `fallback`'s row (the unedited logits) masked instead."""
        allowed = self.allowed()
        vocab = min(self._vocab, logits.shape[-1])
        logits[vocab:] = -torch.inf
        logits[:vocab].masked_fill_(~allowed[:vocab], -torch.inf)
        if fallback is not None and not bool(torch.isfinite(logits).any()):
            logits.copy_(fallback)
            logits[vocab:] = -torch.inf
            logits[:vocab].masked_fill_(~allowed[:vocab], -torch.inf)

    def accepts(self, token: int) -> bool:
        """Consume `token` if the grammar allows it next; False (state unchanged) otherwise."""
        return self._matcher.try_consume_tokens([token]) == 1

    def advance(self, tokens: Sequence[int]) -> None:
        """Commit `tokens` (each one the grammar allowed). Once the structure is complete only the end of the answer
        follows, which the parser does not consume."""
        for token in tokens:
            if self.complete:
                return
            if not self._matcher.consume_token(token):
                self._check()

    def rollback(self, count: int) -> None:
        """Forget the last `count` tokens consumed."""
        if count and not self._matcher.rollback(count):
            self._check()


def constrain_rows(logits: torch.Tensor, raw: torch.Tensor | None, drafts: Sequence[int], grammar: Grammar) -> None:
    """Mask verification rows in place: row i follows the grammar's committed tokens + `drafts[:i]`.

    logits: [k + 1, V]; raw: the same rows before other rules edited them (`Grammar.mask`'s fallback; None when no
    rule did). The drafts are consumed tentatively and rolled back; the first draft the grammar refuses cannot be
    accepted, so the rows after it are never read and stay unmasked.
    """
    consumed = 0
    for i in range(logits.shape[0]):
        grammar.mask(logits[i], raw[i].float() if raw is not None else None)
        if i == len(drafts) or not grammar.accepts(drafts[i]):
            break
        consumed += 1
    grammar.rollback(consumed)


def constrain_drafts(logits: torch.Tensor, grammar: Grammar) -> None:
    """Mask the rows of the next pass's drafts in place, each with the state after the drafts before it (their
    argmax): drafts then spell valid JSON ("{", a quote, a colon, an end after the closing brace), which the teacher
    accepts more often. Only drafts change, never the answer. logits: [m, V] float."""
    consumed = 0
    for i in range(logits.shape[0]):
        grammar.mask(logits[i])
        if not grammar.accepts(int(logits[i].argmax())):  # past the end: nothing but the end-of-answer token
            break
        consumed += 1
    grammar.rollback(consumed)
