"""Constrained decoding (model/decoding/grammar.py) with the real grammar engine (llguidance) on the tiny random
block-diffusion Llama: answers are JSON that matches the schema, and self-speculative decoding equals constrained
autoregressive decoding token for token, with and without the speech guard."""

from __future__ import annotations

import json

import llguidance
import pytest
import torch

from model.decoding.block_passes import BlockPasses, DiffusionSequence
from model.decoding.grammar import Grammar, GrammarError, compile_format, constrain_drafts, response_format
from model.decoding.options import GenerationOptions
from model.decoding.refinement import Refinement
from model.decoding.sampler import DiffusionDecoding, SamplerConfig
from model.decoding.speech_guard import SpeechGuard
from model.runtime.batch_runner import BatchRunner
from scripts.report_lib.passes import PassLog
from scripts.report_lib.tiny_models import LLAMA_EOS, LLAMA_VOCAB
from tests.unit.drive import decode_alone, speculative
from tests.unit.test_batching import drain_together
from tests.unit.test_self_speculative import (  # noqa: F401  (one_thread: autouse, tiny tensors on 1 thread)
    OracleDrafts,
    adapted,
    final_tokens,
    one_thread,
    prompts,
)

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                   "tag": {"enum": ["x", "y"]}},
    "required": ["ok", "n", "tag"],
    "additionalProperties": False,
}


class TinyVocabulary:
    """The tiny Llama's 48 token ids spelled as JSON pieces (EOS 2), in the shape llguidance wraps
    (`llguidance.TokenizerWrapper`): single characters and a few multi-character tokens, so a draft may be refused
    in the middle of a word."""

    eos_token_id = LLAMA_EOS
    bos_token_id = None
    special_token_ids = (0, 1, 2)  # else "<eos>" is five characters a JSON string may hold

    def __init__(self) -> None:
        pieces = ["{", "}", '"', ":", ",", "t", "r", "u", "e", "f", "a", "l", "s", "n", "o", "k", "g", "x", "y",
                  *"0123456789", '{"', '":', ',"', "true", "false", '"ok"', '"n"', '"tag"', '"x"', '"y"', "ok",
                  "tag", "10", "99", '"}', " "]
        self.tokens = [b"<pad>", b"<unk>", b"<eos>", *(piece.encode() for piece in pieces)]
        assert len(self.tokens) == LLAMA_VOCAB

    def __call__(self, text: bytes) -> list[int]:
        """Greedy longest match (llguidance tokenizes forced text with it)."""
        ids, i = [], 0
        while i < len(text):
            token = max((t for t in range(3, len(self.tokens)) if text.startswith(self.tokens[t], i)),
                        key=lambda t: len(self.tokens[t]))
            ids.append(token)
            i += len(self.tokens[token])
        return ids

    def text(self, ids: list[int]) -> str:
        return b"".join(self.tokens[t] for t in ids if t != LLAMA_EOS).decode()


VOCABULARY = TinyVocabulary()
TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(VOCABULARY))


def grammar(schema: dict | None = SCHEMA) -> Grammar:
    fmt = response_format("json_schema", schema) if schema is not None else response_format("json_object")
    return Grammar(TOKENIZER, compile_format(fmt))


def test_constrained_answers_are_json_matching_the_schema_in_both_modes() -> None:
    model = adapted(seed=2)
    for index, prompt in enumerate(prompts(6, seed=2)):
        autoregressive = final_tokens(decode_alone(model, speculative(model, prompt, 40, masks=0, grammar=grammar())))
        assert autoregressive[-1] == LLAMA_EOS, index  # closed JSON, then the end forced
        answer = json.loads(VOCABULARY.text(autoregressive))
        assert set(answer) == {"ok", "n", "tag"} and isinstance(answer["ok"], bool), answer
        assert 0 <= answer["n"] <= 99 and answer["tag"] in ("x", "y"), answer
        for branches in (True, False):
            drafted = speculative(model, prompt, 40, masks=3, grammar=grammar(), branches=branches)
            assert final_tokens(decode_alone(model, drafted)) == autoregressive, (index, branches)


def test_drafts_the_grammar_refuses_are_not_accepted_and_the_answer_is_unchanged() -> None:
    """Oracle drafts (the constrained answer, wrong at random places) are accepted in runs and refused where wrong:
    the tentative advance through drafts and its rollback leave the grammar where the answer is."""
    model = adapted(seed=3)
    guard = SpeechGuard(no_repeat_ngram=2)  # bans repeated token pairs: the grammar must win where both bite
    for index, prompt in enumerate(prompts(6, seed=3)):
        for rules in (None, guard):
            reference = final_tokens(
                decode_alone(model, speculative(model, prompt, 40, masks=0, grammar=grammar(), guard=rules)))
            json.loads(VOCABULARY.text(reference))
            oracle = OracleDrafts(speculative(model, prompt, 40, masks=4, grammar=grammar(), guard=rules),
                                  reference, error_rate=0.2, seed=index)
            refinements = decode_alone(model, oracle)
            assert final_tokens(refinements) == reference, (index, rules)
            assert len(refinements) < len(reference), index  # drafts were accepted, not only bonus tokens


def test_constrained_answers_sharing_passes_equal_their_answers_alone() -> None:
    """In a batched pass each answer's rows are masked with its own grammar (and drafts of one block, no branches)."""
    model = adapted(seed=5)
    cases = [(prompt, 3 if i % 2 else 0) for i, prompt in enumerate(prompts(4, seed=5))]
    alone = [final_tokens(decode_alone(model, speculative(model, prompt, 40, masks=0, grammar=grammar())))
             for prompt, _ in cases]
    runner = BatchRunner(model, max_batch=4)
    try:
        with PassLog() as passes:
            runs = [runner.submit(speculative(model, prompt, 40, masks=masks, grammar=grammar()))
                    for prompt, masks in cases]
            together = [final_tokens(refinements) for refinements in drain_together(runs)]
    finally:
        runner.close()
    assert max(passes.sizes) >= 2  # the answers really shared passes
    assert together == alone


def diffusion(model: object, prompt: list[int], length: int, config: SamplerConfig, state: Grammar,
              guard: SpeechGuard | None = None, temperature: float = 0.0, seed: int = 0) -> DiffusionSequence:
    decoding = DiffusionDecoding(model.mask_id, frozenset({LLAMA_EOS}), length, config,  # type: ignore[attr-defined]
                                 GenerationOptions(temperature=temperature, seed=seed), guard, state)
    return DiffusionSequence(decoding, BlockPasses(prompt, model.vocab_size))  # type: ignore[attr-defined]


def committed_prefix(refinement: Refinement) -> list[int]:
    """The pass's committed tokens, checked to be a prefix of the answer (commits under a grammar run left to right)."""
    count = sum(refinement.committed)
    assert all(refinement.committed[:count]), refinement.committed
    return list(refinement.tokens[:count])


DIFFUSION_CONFIGS = [
    SamplerConfig(block_length=4, steps_per_block=4, threshold=0.9, remasking="left_to_right"),  # the bundled card's
    SamplerConfig(block_length=4, steps_per_block=2, remasking="low_confidence"),  # a budget of 2 a pass
    SamplerConfig(block_length=8, steps_per_block=8, threshold=0.5),  # confident positions anywhere in the block
]


@pytest.mark.parametrize("config", DIFFUSION_CONFIGS)
def test_diffusion_commits_only_a_prefix_the_grammar_accepts_and_answers_match_the_schema(
    config: SamplerConfig,
) -> None:
    model = adapted(seed=2)
    parallel = 0
    for index, prompt in enumerate(prompts(6, seed=2)):
        refinements = decode_alone(model, diffusion(model, prompt, 40, config, grammar()))
        for refinement in refinements:  # every pass: what is committed is valid JSON so far
            tokens = [t for t in committed_prefix(refinement) if t != LLAMA_EOS]
            fresh = grammar()
            assert all(fresh.accepts(token) for token in tokens), (index, VOCABULARY.text(tokens))
        tokens = final_tokens(refinements)
        assert LLAMA_EOS in tokens, (index, VOCABULARY.text(tokens))  # closed, then the end
        answer = json.loads(VOCABULARY.text(tokens[: tokens.index(LLAMA_EOS)]))
        assert set(answer) == {"ok", "n", "tag"} and 0 <= answer["n"] <= 99 and answer["tag"] in ("x", "y"), answer
        parallel += len(refinements) < tokens.index(LLAMA_EOS) + 1
    assert parallel, "no answer committed more than one token in a pass"


def test_diffusion_under_a_grammar_with_the_guard_and_sampling_is_valid_json() -> None:
    model = adapted(seed=4)
    config = DIFFUSION_CONFIGS[0]
    guard = SpeechGuard(no_repeat_ngram=2)
    for seed, prompt in enumerate(prompts(4, seed=4)):
        for rules, temperature in ((guard, 0.0), (None, 1.0)):
            tokens = final_tokens(decode_alone(model, diffusion(model, prompt, 60, config, grammar(None), rules,
                                                                temperature, seed)))
            if LLAMA_EOS in tokens:  # a sampled answer may run to its length inside a string
                assert isinstance(json.loads(VOCABULARY.text(tokens[: tokens.index(LLAMA_EOS)])), dict), seed


def test_sampled_constrained_answers_are_valid_json() -> None:
    model = adapted(seed=4)
    for seed, prompt in enumerate(prompts(4, seed=4)):
        tokens = final_tokens(decode_alone(
            model, speculative(model, prompt, 60, masks=3, grammar=grammar(None), temperature=1.0, seed=seed)))
        if tokens[-1] == LLAMA_EOS:  # a sampled answer may run to its length inside a string
            assert isinstance(json.loads(VOCABULARY.text(tokens)), dict), seed


def test_the_mask_refuses_what_the_grammar_refuses_and_the_extra_column() -> None:
    state = grammar()
    logits = torch.zeros(LLAMA_VOCAB + 1)  # the bundled model's mask id column past the vocabulary
    state.mask(logits)
    allowed = {i for i in range(len(logits)) if logits[i] == 0}
    assert allowed and all(VOCABULARY.tokens[i].startswith(b"{") for i in allowed)  # LLAMA_VOCAB (mask id) refused
    state.advance(VOCABULARY(b'{"ok":true,"n":7,"tag":"y"}'))
    assert state.complete
    logits = torch.zeros(LLAMA_VOCAB + 1)
    state.mask(logits)
    assert [i for i in range(len(logits)) if logits[i] == 0] == [LLAMA_EOS]


def test_drafts_are_masked_along_their_own_path_and_the_state_is_restored() -> None:
    state = grammar()
    state.advance(VOCABULARY(b'{"ok":'))
    logits = torch.randn(6, LLAMA_VOCAB + 1, generator=torch.Generator().manual_seed(0))
    constrain_drafts(logits, state)
    drafts = logits.argmax(dim=-1).tolist()
    assert VOCABULARY.tokens[drafts[0]] in (b"t", b"f", b"true", b"false")
    for token in drafts:  # every draft is one the grammar allows after the ones before it
        assert state.accepts(token) or state.complete, drafts
    fresh = grammar()
    fresh.advance(VOCABULARY(b'{"ok":'))
    restored = grammar()
    restored.advance(VOCABULARY(b'{"ok":'))
    constrain_drafts(torch.randn(6, LLAMA_VOCAB + 1), restored)
    assert torch.equal(restored.allowed(), fresh.allowed())


@pytest.mark.parametrize(("schema", "words"), [
    ('{"type": "object", "properties": {"a": {"type": "strin"}}}', "strin"),
    ('{"type": "array", "uniqueItems": true}', "uniqueItems"),
    ('{"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}', "missing"),
    ('{"type": "object",', "not valid JSON"),
    ('{"type": "object", "properties": {"a": {"type": "string", "maxLenght": 3}}}', "'maxLenght' at #/properties/a"),
    ('{"type": "number", "maximum": 3, "exclusiveMaximum": true}', "'exclusiveMaximum' at # as a boolean"),
    ('{"anyOf": [{"type": "string"}, {"type": "array", "items": {"typo": 1}}]}', "'typo' at #/anyOf/1/items"),
    ("[1, 2]", "must be a JSON object"),
])
def test_a_schema_the_engine_cannot_enforce_is_a_typed_error_naming_it(schema: str, words: str) -> None:
    with pytest.raises(GrammarError, match=words):
        compile_format(response_format("json_schema", schema))


def test_a_pydantic_schema_with_annotations_and_definitions_compiles() -> None:
    schema = {"$defs": {"Pet": {"properties": {"name": {"title": "Name", "type": "string", "description": "its name"}},
                                "required": ["name"], "title": "Pet", "type": "object", "x-note": 1}},
              "properties": {"pets": {"items": {"$ref": "#/$defs/Pet"}, "title": "Pets", "type": "array",
                                      "default": [{"typo": 1}]}},
              "required": ["pets"], "title": "Owner", "type": "object", "additionalProperties": False}
    assert compile_format(response_format("json_schema", schema))


def test_a_schema_is_kept_compact_with_its_keys_in_order() -> None:
    """Order matters: the grammar writes properties in the schema's order (a pydantic model's field order)."""
    one = response_format("json_schema", {"type": "object", "required": ["a"]})
    other = response_format("json_schema", '{ "type": "object",  "required": ["a"] }')
    assert one == other and one.schema == '{"type":"object","required":["a"]}'
    state = grammar()
    state.advance(VOCABULARY(b'{"ok":true,"n":7,'))
    logits = torch.zeros(LLAMA_VOCAB + 1)
    state.mask(logits)
    assert logits[VOCABULARY.tokens.index(b'"tag"')] == 0 and logits[VOCABULARY.tokens.index(b'"n"')] == -torch.inf
