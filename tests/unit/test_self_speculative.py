"""Self-speculative and autoregressive decoding (model/decoding/speculative.py) on a tiny random block-diffusion Llama,
fp32
(and bf16 where exactness depends on the kernels' rounding)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from model.adapters.sampler_backend import SamplerBackend
from model.bundled.block_diffusion import AdapterConfig, BlockDiffusionLM
from model.chat.engine import DiffusionChatModel
from model.decoding.block_passes import BlockPasses, DiffusionSequence
from model.decoding.options import GenerationOptions
from model.decoding.refinement import Refinement
from model.decoding.sampler import DiffusionDecoding, SamplerConfig
from model.decoding.speculative import SpeculativeDecoding, accept_greedy, accept_sampled
from model.decoding.speech_guard import SpeechGuard, WordClasses
from model.errors import ModelError
from model.process.threads import torch_threads
from model.runtime.batch_runner import BatchRunner
from model.runtime.batching import Feed, SlotCache, batched_pass, prefill
from model.training.block_training import make_batch
from scripts.report_lib.tiny_models import LLAMA_EOS, LLAMA_VOCAB, tiny_llama
from tests.unit.drive import decode, decode_alone, one_pass, speculative

VOCAB = LLAMA_VOCAB
EOS = LLAMA_EOS


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny tensors: thread hand-offs cost more than the work (100x on a busy 2-core machine)."""
    with torch_threads(1):
        yield


def adapted(seed: int = 0) -> BlockDiffusionLM:
    model = BlockDiffusionLM(tiny_llama(seed), AdapterConfig(block_length=4, lora_rank=4))
    with torch.no_grad():  # a strong adapter: a gating mistake would change the teacher's logits visibly
        for name, parameter in model.named_parameters():
            if "lora_b" in name:
                parameter.normal_(0, 0.2)
    return model.eval()


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 12))] for _ in range(count)]


@torch.no_grad()
def teacher_greedy(teacher: LlamaForCausalLM, prompt: list[int], length: int) -> list[int]:
    """The reference: plain greedy decoding of the base model, no cache, no adapter."""
    ids = list(prompt)
    for _ in range(length):
        ids.append(int(teacher(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


class OracleDrafts:
    """A self-speculative decoding whose masks draft the reference answer, wrong at random places: so passes accept
    several drafts, reject others, and the real network's verification and cache handling are exercised on both paths.
    It wraps the decoding the runner drives and replaces the pass's mask logits before `consume` sees them."""

    def __init__(self, decoding: SpeculativeDecoding, reference: list[int], error_rate: float, seed: int) -> None:
        self.decoding = decoding
        self.reference = reference
        self.error_rate = error_rate
        self.rng = random.Random(seed)
        self.prompt_length = len(decoding.prompt)
        self.cached = len(decoding.cached_prompt)  # tokens the cache holds before the next pass
        self._feed = Feed(clean=())

    @property
    def cached_prompt(self) -> list[int]:
        return self.decoding.cached_prompt

    def fold_prompt(self, tokens: list[int]) -> None:
        self.cached -= len(tokens)  # the first pass encodes them: the cache holds the prompt before them
        self.decoding.fold_prompt(tokens)

    def feed(self, crowd: int = 1) -> Feed:
        self._feed = self.decoding.feed(crowd)
        return self._feed

    def consume(
        self, clean_logits: torch.Tensor, mask_logits: torch.Tensor, elapsed_s: float, cancelled: bool = False
    ) -> tuple[Refinement, int]:
        feed = self._feed
        after = feed.after or (len(feed.clean),) * len(feed.noisy)
        oracle = torch.zeros_like(mask_logits)
        for j, block in enumerate(after):
            # answer index this mask row predicts: its block follows clean[block - 1]; it is row j - first of it
            index = self.cached + block - self.prompt_length + 1 + j - after.index(block)
            token = self.reference[index] if index < len(self.reference) else EOS
            if self.rng.random() < self.error_rate:
                token = self.rng.randrange(3, VOCAB)
            oracle[j, token] = 10.0
        refinement, kept = self.decoding.consume(clean_logits, oracle, elapsed_s, cancelled)
        self.cached += kept
        return refinement, kept


def final_tokens(refinements: list) -> list[int]:
    last = refinements[-1]
    assert last.done and all(last.committed)
    return list(last.tokens)


@pytest.mark.slow
def test_self_speculative_equals_autoregressive_equals_the_teacher() -> None:
    model = adapted()
    teacher = tiny_llama()  # same seed: the base weights without any adapter
    warm = BatchRunner(model, max_batch=1)  # one runner for every answer: the prompt cache is reused too
    accepted_per_pass = []
    for index, prompt in enumerate(prompts(16)):
        reference = teacher_greedy(teacher, prompt, 20)
        autoregressive = final_tokens(decode(warm, speculative(model, prompt, 20, masks=0)))
        expected = reference[: reference.index(EOS) + 1] if EOS in reference else reference
        assert autoregressive == expected, index
        for branches in (True, False):
            drafting = final_tokens(decode(warm, speculative(model, prompt, 20, masks=4, branches=branches)))
            oracle = OracleDrafts(speculative(model, prompt, 20, masks=4, branches=branches), reference,
                                  error_rate=0.25, seed=index)
            drafted = decode(warm, oracle)
            assert drafting == expected, (index, branches)
            assert final_tokens(drafted) == expected, (index, branches)
            if branches:
                accepted_per_pass.append(len(expected) / len(drafted))
    # autoregressive makes one token a pass; good drafts make several (the oracle is right 75 % of the time)
    assert sum(accepted_per_pass) / len(accepted_per_pass) > 2.0
    warm.close()


def test_a_block_after_every_draft_keeps_drafting_after_a_rejection() -> None:
    """With one block after all drafts, a pass that rejects a draft leaves the next pass none; with a block after
    each draft, the block after the accepted ones drafts on. Same answers, fewer passes (same oracle errors)."""
    model = adapted(seed=3)
    teacher = tiny_llama(seed=3)
    passes = {True: 0, False: 0}
    for index, prompt in enumerate(prompts(12, seed=3)):
        reference = teacher_greedy(teacher, prompt, 24)
        answers = {}
        for branches in (True, False):
            oracle = OracleDrafts(speculative(model, prompt, 24, masks=4, branches=branches), reference,
                                  error_rate=0.3, seed=index)
            refinements = decode_alone(model, oracle)
            answers[branches] = final_tokens(refinements)
            passes[branches] += len(refinements)
            drafted = [r for r in refinements[:-1] if not all(r.committed)]
            if branches:  # every pass but the last one leaves drafts for the next
                assert len(drafted) == len(refinements) - 1 or answers[branches][-1] == EOS, index
        assert answers[True] == answers[False], index
    assert passes[True] < 0.9 * passes[False]


def test_the_speech_guard_keeps_both_modes_equal_and_the_answer_free_of_repeats() -> None:
    model = adapted(seed=1)
    base = SpeechGuard(
        no_repeat_ngram=2, end_after=6, sentence_end_ids=frozenset({7, 8}), eos_id=EOS,
        no_copy_ngram=3, no_copy_opening=1,
    )
    for index, prompt in enumerate(prompts(12, seed=1)):
        guard = base.for_prompt(prompt)
        autoregressive = final_tokens(decode_alone(model, speculative(model, prompt, 24, masks=0, guard=guard)))
        oracle = OracleDrafts(speculative(model, prompt, 24, masks=4, guard=guard), autoregressive, error_rate=0.2,
                              seed=index)
        assert final_tokens(decode_alone(model, oracle)) == autoregressive, index
        bigrams = list(itertools.pairwise(autoregressive))
        assert len(bigrams) == len(set(bigrams)), index
        prompt_trigrams = set(zip(prompt, prompt[1:], prompt[2:], strict=False))
        assert not prompt_trigrams & set(zip(autoregressive, autoregressive[1:], autoregressive[2:], strict=False))
        ends = [i for i, token in enumerate(autoregressive) if token in (7, 8) and i >= 5]
        if ends:  # the answer stops right after the first sentence end past 6 tokens
            assert autoregressive[ends[0] + 1 :] == [EOS], index


def test_the_guard_compares_words_not_token_ids() -> None:
    """ "A quick breakfast is a quick" must not go on with " breakfast": "A" and " a" are one word to a listener."""
    texts = ["A", " a", " quick", " breakfast", " is", ".", " Breakfast", "breakfast", " lunch", "!"]
    words = WordClasses.from_texts(texts)
    assert words.of[0] == words.of[1] and words.of[3] == words.of[6] == words.of[7]
    assert words.of[5] == words.of[9] == -1  # punctuation spells no word
    answer = [0, 2, 3, 4, 1, 2]  # "A quick breakfast is a quick"
    by_words = SpeechGuard(no_repeat_ngram=3, words=words)
    logits = torch.zeros(len(texts))
    by_words.apply(logits, answer)
    banned = {i for i in range(len(texts)) if logits[i] == -torch.inf}
    assert banned == {3, 6, 7}  # every spelling of "breakfast", nothing else
    by_ids = torch.zeros(len(texts))
    SpeechGuard(no_repeat_ngram=3).apply(by_ids, answer)
    assert not torch.isinf(by_ids).any()  # the token-id rule lets this loop through
    # punctuation is skipped: "A quick breakfast. A quick" -> no " breakfast" again either
    logits = torch.zeros(len(texts))
    by_words.apply(logits, [0, 2, 3, 5, 0, 2])
    assert logits[3] == -torch.inf and logits[8] == 0.0
    # and punctuation still counts where it repeats: 'A: "A: "' -> no second ' "' ... with ":" and ' "' as tokens
    texts = ["A", " a", ":", ' "', " B"]
    logits = torch.zeros(len(texts))
    SpeechGuard(no_repeat_ngram=3, words=WordClasses.from_texts(texts)).apply(logits, [0, 2, 3, 1, 2])
    assert {i for i in range(len(texts)) if logits[i] == -torch.inf} == {3}


def test_the_guard_breaks_a_copy_of_the_prompt_punctuation_included() -> None:
    """An answer copying an earlier answer ('A: "A: "') must leave it by the n-th token, whatever its case."""
    texts = ["A", " a", ":", ' "', " joke", "?", " The", " the", " end"]
    guard = SpeechGuard(no_copy_ngram=4, words=WordClasses.from_texts(texts))
    prompt = [4, 5, 0, 2, 3, 0, 2, 3]  # ' joke? A: "A: "'
    logits = torch.zeros(len(texts))
    guard.for_prompt(prompt).apply(logits, [1, 2, 3])  # ' a: "' copies 'A: "' ...
    assert {i for i in range(len(texts)) if logits[i] == -torch.inf} == {0, 1}  # ... so no "A" / " a" next
    logits = torch.zeros(len(texts))
    guard.for_prompt(prompt).apply(logits, [1, 2, 6])  # ' a: The' is no copy
    assert not torch.isinf(logits).any()
    logits = torch.zeros(len(texts))
    guard.apply(logits, [1, 2, 3])  # a guard not given the prompt bans nothing
    assert not torch.isinf(logits).any()


def test_the_guard_leaves_a_tool_call_alone() -> None:
    """A call copies the offer and the user's words by design: an answer opening with a call opener is exempt."""
    texts = ["<", "call", " hello", " there", " you", "."]
    guard = SpeechGuard(no_copy_ngram=3, words=WordClasses.from_texts(texts), call_openers=frozenset({0}))
    prompt = [2, 3, 4, 5]  # ' hello there you.'
    logits = torch.zeros(len(texts))
    guard.for_prompt(prompt).apply(logits, [0, 1, 2, 3])  # '<call hello there' goes on to copy ' you'
    assert not torch.isinf(logits).any()
    guard.for_prompt(prompt).apply(logits, [2, 3])  # words copying ' hello there you' are still stopped
    assert {i for i in range(len(texts)) if logits[i] == -torch.inf} == {4}


def test_the_guard_keeps_an_answer_from_opening_as_an_earlier_answer_did() -> None:
    """The prompt's last 3 tokens are the assistant header; after each earlier header sits an earlier answer."""
    texts = ["<h>", "assistant", "\n", "A", ":", " thanks", " joke", " Sure", " a"]
    guard = SpeechGuard(no_copy_opening=2, words=WordClasses.from_texts(texts))
    header = [0, 1, 2]
    prompt = [6, *header, 3, 4, 5, 6, *header]  # ' joke' <h>assistant\n 'A: thanks' ' joke' <h>assistant\n
    request = guard.for_prompt(prompt)
    logits = torch.zeros(len(texts))
    request.apply(logits, [8])  # " a" opens like "A" did ...
    assert {i for i in range(len(texts)) if logits[i] == -torch.inf} == {4}  # ... so not "a:"
    for answer in ([7], [3, 4]):  # another opening, or past the opening: free
        logits = torch.zeros(len(texts))
        request.apply(logits, answer)
        assert not torch.isinf(logits).any()
    assert guard.for_prompt([6, *header]).openings == frozenset()  # the first answer has nothing to avoid


def test_the_cache_after_rejected_drafts_equals_a_fresh_prefill_of_the_accepted_text() -> None:
    model = adapted(seed=2)
    teacher = tiny_llama(seed=2)
    prompt = [5, 9, 11, 3, 7, 20]
    reference = teacher_greedy(teacher, prompt, 16)
    runner = BatchRunner(model, max_batch=1)
    oracle = OracleDrafts(speculative(model, prompt, 16, masks=4), reference, error_rate=0.5, seed=0)
    refinements = decode(runner, oracle)
    runner.close()
    answer = final_tokens(refinements)
    assert len(refinements) < len(answer)  # some drafts were accepted ...
    cache, fresh = runner.cache, SlotCache(1)
    prefill(model, fresh, 0, (prompt + answer)[:-1])  # everything but the last token, as a pass leaves it
    assert cache.slots[0].ids == fresh.slots[0].ids == (prompt + answer)[:-1]
    held = len(fresh.slots[0].ids)
    for warm, cold in ((cache._keys, fresh._keys), (cache._values, fresh._values)):
        for warm_layer, fresh_layer in zip(warm, cold, strict=True):
            torch.testing.assert_close(warm_layer[:, :, :held], fresh_layer[:, :, :held], atol=1e-5, rtol=1e-5)


def test_accept_greedy_takes_the_agreeing_prefix_and_the_teachers_next_token() -> None:
    logits = torch.full((4, 6), -1.0)
    for row, token in enumerate([3, 1, 4, 5]):
        logits[row, token] = 1.0
    assert accept_greedy(torch.tensor([3, 1, 4]), logits) == (3, 5)
    assert accept_greedy(torch.tensor([3, 2, 4]), logits) == (1, 1)
    assert accept_greedy(torch.tensor([0, 1, 4]), logits) == (0, 3)
    assert accept_greedy(torch.tensor([], dtype=torch.long), logits[:1]) == (0, 3)
    assert accept_greedy([3, 1], logits[:3]) == (2, 4)  # drafts as the decoding step keeps them, a list
    tied = torch.zeros(2, 6)
    tied[:, [2, 5]] = 1.0  # equal maxima: the first, as torch's argmax gives it
    assert accept_greedy([2], tied) == (1, 2)


@pytest.mark.parametrize("drafts", [[1, 0], [3, 3], [0, 2]])
def test_speculative_sampling_follows_the_teachers_distribution(drafts: list[int]) -> None:
    """Empirical frequencies of the first two emitted tokens against the target p(x1) p(x2 | x1)."""
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    logits = p.log()  # temperature 1 recovers p; the second row is the target after a first token equal to drafts[0]
    other = torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float64)  # the target after any other first token
    generator = torch.Generator().manual_seed(0)
    trials = 10_000  # fixed seed: deterministic; 0.015 is about 3 standard deviations
    counts: Counter[tuple[int, int]] = Counter()
    for _ in range(trials):
        accepted, token = accept_sampled(torch.tensor(drafts), logits, 1.0, generator)
        emitted = [*drafts[:accepted], token]
        if len(emitted) == 1:  # the pass ended after one token: the second comes from a later pass
            second_p = p[1] if emitted[0] == drafts[0] else other
            emitted.append(int(torch.multinomial(second_p, 1, generator=generator)))
        counts[(emitted[0], emitted[1])] += 1
    for first in range(4):
        second_p = p[1] if first == drafts[0] else other
        for second in range(4):
            expected = float(p[0, first] * second_p[second])
            assert abs(counts[(first, second)] / trials - expected) < 0.015, (first, second)


def test_the_training_batch_and_the_decoding_pass_give_the_same_logits_for_a_masked_block() -> None:
    model = adapted(seed=4)
    prompt, answer = [5, 9, 11, 3, 7, 20], [10, 11, 12, 13, 14, 15, 16, 17, EOS]
    batch = make_batch([(prompt, answer)], 4, model.mask_id, EOS, 1, torch.Generator().manual_seed(0))
    noisy_ids = batch.noisy_ids.clone()
    noisy_ids[0, 4:8] = model.mask_id  # the second block fully masked, as a decoding pass drafts it
    with torch.no_grad():
        from transformers import DynamicCache

        cache = DynamicCache()
        t = batch.clean_ids.shape[1]
        clean_noisy = torch.zeros_like(batch.clean_ids, dtype=torch.bool)
        model(batch.clean_ids, torch.arange(t)[None], batch.clean_bias, clean_noisy, cache)
        noisy = torch.ones_like(noisy_ids, dtype=torch.bool)
        training = model(noisy_ids, batch.noisy_pos, batch.noisy_bias, noisy, cache)[0, 4:8]
    # the cache ends just before the block's last clean token
    _, decoding = one_pass(model, prompt + answer[:3], Feed((answer[3],), (model.mask_id,) * 4))
    torch.testing.assert_close(decoding, training, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("masks", [3, 4])
def test_the_drafting_batch_and_a_drafting_pass_give_the_same_logits(masks: int) -> None:
    # A decoding pass feeds `masks` mask rows after a clean token; the drafting batch's blocks must look the same to
    # those rows (blocks of masks + 1, the last position hidden), or the adapter learns to draft beside a mask that
    # decoding never shows it.
    model = adapted(seed=4)
    prompt, answer = [5, 9, 11, 3, 7, 20], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 21, EOS]
    block, copies = masks + 1, 12
    batch = make_batch([(prompt, answer)], block, model.mask_id, EOS, copies, torch.Generator().manual_seed(0),
                       drafting=True)
    n, t = batch.noisy_ids.shape[1] // copies, batch.clean_ids.shape[1]
    allowed = batch.noisy_bias[0, 0] == 0
    # a copy whose block starts at answer position 4 (it sees exactly the prompt and answer[:4])
    copy = next(c for c in range(copies) if int(allowed[c * n + 4, :t].sum()) == len(prompt) + 4)
    rows = slice(copy * n + 4, copy * n + 4 + masks)
    with torch.no_grad():
        from transformers import DynamicCache

        cache = DynamicCache()
        clean_noisy = torch.zeros_like(batch.clean_ids, dtype=torch.bool)
        model(batch.clean_ids, torch.arange(t)[None], batch.clean_bias, clean_noisy, cache)
        noisy = torch.ones_like(batch.noisy_ids, dtype=torch.bool)
        training = model(batch.noisy_ids, batch.noisy_pos, batch.noisy_bias, noisy, cache)[0, rows]
    # the cache ends just before answer[3], the pass's clean token
    _, decoding = one_pass(model, prompt + answer[:3], Feed((answer[3],), (model.mask_id,) * masks))
    torch.testing.assert_close(decoding, training, atol=1e-4, rtol=1e-4)
    assert batch.targets[0, rows].tolist() == answer[5 : 5 + masks]  # each mask row drafts the token after the next


def test_self_speculative_is_refused_for_a_model_that_cannot_verify() -> None:
    class MaskedOnly:
        mask_id, eos_ids, vocab_size, block_causal = 4, frozenset({EOS}), VOCAB, False

    with pytest.raises(ModelError, match="cannot decode self-speculative"):
        config = SamplerConfig(decoding="self-speculative")
        DiffusionChatModel("toy", None, SamplerBackend("toy", MaskedOnly(), config), config)
    with pytest.raises(ModelError, match="decoding must be one of"):
        SamplerConfig(decoding="beam")


def test_the_speech_guard_holds_in_diffusion_decoding_too() -> None:
    model = adapted(seed=1)
    guard = SpeechGuard(no_repeat_ngram=2)
    config = SamplerConfig(block_length=4, steps_per_block=4, threshold=0.3, remasking="left_to_right")
    repeats = []
    for prompt in prompts(8, seed=3):
        decoding = DiffusionDecoding(model.mask_id, frozenset({EOS}), 24, config, GenerationOptions(seed=0), guard)
        sequence = DiffusionSequence(decoding, BlockPasses(prompt, model.vocab_size))
        tokens = final_tokens(decode_alone(model, sequence))
        answer = tokens[: tokens.index(EOS)] if EOS in tokens else tokens
        bigrams = list(itertools.pairwise(answer))
        repeats.append(len(bigrams) - len(set(bigrams)))
    assert repeats == [0] * 8


def test_dlm_generate_refuses_self_speculative_for_a_masked_lm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from model.cli import main
    from scripts.report_lib.tiny_models import tiny_bert

    folder = tiny_bert(tmp_path / "bert")
    for mode in ("self-speculative", "autoregressive"):
        assert main(["generate", "hello there", "--model", str(folder), "--decoding", mode]) == 2
        assert f"cannot decode {mode}" in capsys.readouterr().err
    assert main(["generate", "hello there", "--model", str(folder), "--decoding", "diffusion",
                 "--max-new-tokens", "4", "--block-length", "4"]) == 0


def test_the_drafting_batch_masks_whole_shifted_blocks_and_weights_near_drafts_more() -> None:
    generator = torch.Generator().manual_seed(5)
    prompt, answer = [5, 9, 11, 3, 7, 20], [10, 11, 12, 13, 14, 15, 16, 17, 18, EOS]
    mask_id = VOCAB
    batch = make_batch([(prompt, answer)], 4, mask_id, EOS, 3, generator, drafting=True, near_weight=0.5)
    n = len(answer) + 2  # rounded up to whole blocks of 4
    t = batch.clean_ids.shape[1]
    assert (batch.noisy_ids == mask_id).all()
    allowed = batch.noisy_bias[0, 0] == 0
    offsets = set()
    for copy in range(3):
        rows = range(copy * n, (copy + 1) * n)
        clean_sees = [int(allowed[q, :t].sum()) for q in rows]  # the clean prefix each row attends to
        starts = sorted(set(clean_sees))
        offsets.add((starts[1] - len(prompt)) % 4 if len(starts) > 1 else 0)
        for q in rows:  # a row predicts the next token only inside its block; the first of a block is the teacher's
            j = q - copy * n
            same_block = j + 1 < n and clean_sees[j + 1] == clean_sees[j]
            assert (batch.targets[0, q] != -100) == same_block
            if same_block:
                assert batch.targets[0, q] == [*answer, EOS, EOS][j + 1]
                assert batch.weights[0, q] == 0.5 ** (j + len(prompt) - clean_sees[j])
    assert len(offsets) > 1  # copies start their blocks at different answer positions


def bf16_adapted(seed: int = 0) -> BlockDiffusionLM:
    """A two-layer bf16 Llama with SmolLM2's attention (9 query heads of 64 over 3 key heads): the kernels whose
    rounding depends on a pass's shape."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=512, hidden_size=576, intermediate_size=1152, num_hidden_layers=2, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, max_position_embeddings=512, eos_token_id=EOS, tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    model = BlockDiffusionLM(LlamaForCausalLM(config).to(torch.bfloat16), AdapterConfig(block_length=4, lora_rank=4))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_b" in name:
                parameter.normal_(0, 0.2)
    return model.eval()


@pytest.mark.slow
def test_in_bf16_a_tokens_logits_do_not_depend_on_the_rows_sharing_its_pass() -> None:
    # The attention kernel's rounding depended on the pass's shape, and bf16 near-ties then flip whole answers: the
    # sum over L + 4 keys and over L + 19 keys differed (keys are now rounded up to KEY_MULTIPLE), and so did a lone
    # query row over repeated keys and the same row among others (model/runtime/fast_pass.py `_attend`).
    assert rows_whose_logits_differ(bf16_adapted(), range(5, 200, 3)) == []


def rows_whose_logits_differ(model: BlockDiffusionLM, lengths: range) -> list[tuple[int, int]]:
    """(cache length, rows) of every pass whose first clean row's logits differ from the same token's as a lone
    autoregressive step after the same cache. The passes share one prefilled cache (a pass keeps nothing: `keep`),
    so each after the first also runs over the keys the last one left past the slot's length, as decoding does."""
    generator = torch.Generator().manual_seed(1)
    differ = []
    for length in lengths:
        tokens = torch.randint(3, 512, (length,), generator=generator).tolist()
        alone = None
        cache = SlotCache(1)
        prefill(model, cache, 0, tokens[:-1])
        for rows in (1, 1, 4, 8, 16):  # an autoregressive step first (one row, no masks), then drafting passes
            clean = (tokens[-1], *torch.randint(3, 512, (rows - 1,), generator=generator).tolist())
            masks = (model.mask_id,) * (3 if alone is not None else 0)
            [(logits, _)] = batched_pass(model, cache, [0], [Feed(clean=clean, noisy=masks)])
            if alone is None:
                alone = logits[0]
            elif not torch.equal(alone, logits[0]):
                differ.append((length, rows))
    return differ


@pytest.mark.slow
def test_in_bf16_self_speculative_answers_equal_autoregressive_ones_bit_for_bit() -> None:
    model = bf16_adapted()
    with torch.no_grad():  # large logits: bf16 near-ties are common, as in SmolLM2's 49k vocabulary (2 of 24 answers
        model.base.model.norm.weight.mul_(60.0)  # differed between the modes before keys were rounded up)
    assert_modes_agree(model, prompts_count=12)


def assert_modes_agree(model: BlockDiffusionLM, prompts_count: int) -> None:
    """Self-speculative answers with 3 and 4 masks a block equal the autoregressive answer, on random prompts."""
    rng = random.Random(3)
    runner = BatchRunner(model, max_batch=1)  # one for every answer, as the chat model's: prompt caches reused
    for index in range(prompts_count):
        prompt = [rng.randrange(3, 512) for _ in range(rng.randrange(1, 40))]
        autoregressive = final_tokens(decode(runner, speculative(model, prompt, 40, masks=0)))
        for masks in (3, 4):
            drafting = final_tokens(decode(runner, speculative(model, prompt, 40, masks=masks)))
            assert drafting == autoregressive, (index, masks)
    runner.close()
