"""DiffusionChatModel on a tiny real BERT: drafts, incremental detokenising, stop strings, options, queueing."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from model.adapters.masked_lm import MaskedLMDenoiser, load_masked_lm
from model.adapters.sampler_backend import SamplerBackend
from model.chat import ChatMessage, ChatModel, Draft, DraftPiece, GenerationOptions
from model.chat.engine import DiffusionChatModel
from model.chat.stop_strings import end_at_stop
from model.chat.text import TokenTexts, draft_from_refinement, token_texts
from model.decoding.refinement import Refinement
from model.decoding.sampler import SamplerConfig
from model.errors import ContextLengthExceeded, ModelError
from scripts.report_lib.tiny_models import BYTE_EOS, byte_tokenizer, scripted_byte_model, tiny_bert


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert"))


def chat_model(folder: Path, denoiser_class=MaskedLMDenoiser, **sampler) -> DiffusionChatModel:
    tokenizer, denoiser = load_masked_lm(str(folder))
    if denoiser_class is not MaskedLMDenoiser:
        denoiser = denoiser_class(denoiser.model, denoiser.mask_id, denoiser.eos_ids)
    config = SamplerConfig(**({"block_length": 8, "steps_per_block": 8} | sampler))
    return DiffusionChatModel("tiny", tokenizer, SamplerBackend("tiny", denoiser, config), config)


def test_multi_byte_characters_come_out_whole() -> None:
    tokenizer = byte_tokenizer()
    tokens = tokenizer.encode("héllo wörld")
    texts = token_texts(tokenizer, tokens)
    assert len(tokens) == 13 and len(texts) == 13
    assert "".join(texts) == "héllo wörld"
    assert texts[1] == "" and texts[2] == "é"  # the first byte of "é" waits for the second


def test_an_answers_texts_decoded_pass_by_pass_are_its_texts_decoded_whole() -> None:
    """`TokenTexts` decodes only what changed since its last call: over passes that commit tokens, redraft the
    guesses after them (multi-byte characters split across passes) and end, each call gives what decoding the
    tokens whole gives."""
    import random

    tokenizer = byte_tokenizer()
    answer = tokenizer.encode("héllo wörld, ça va? Ünïcode ñ")
    rng = random.Random(5)
    texts = TokenTexts(tokenizer)
    committed = 0
    while committed < len(answer):
        committed = min(len(answer), committed + rng.randint(0, 3))
        guesses = [rng.choice(answer) for _ in range(rng.randint(0, 4))]
        tokens = answer[:committed] + guesses
        final = committed == len(answer) and not guesses
        assert texts(tokens, final) == token_texts(tokenizer, tokens, final), tokens
    assert "".join(texts(answer, final=True)) == "héllo wörld, ça va? Ünïcode ñ"


def test_draft_cuts_at_the_first_eos_guess_and_counts_committed_tokens() -> None:
    tokenizer = byte_tokenizer()
    ids = tokenizer.encode("hé!")  # 4 tokens
    eos = tokenizer.encode("~")[0]
    refinement = Refinement(
        step=2,
        block=0,
        tokens=(*ids, eos, ids[0]),
        committed=(True, True, False, False, False, True),
        confidence=(1.0, 0.9, 0.8, 0.7, 0.6, 0.5),
        elapsed_s=0.01,
        eos_ids=frozenset({eos}),
    )
    draft = draft_from_refinement(tokenizer, refinement, prompt_tokens=7)
    assert draft.text == "hé!"
    assert [(p.text, p.committed) for p in draft.pieces] == [("h", True), ("é", False), ("!", False)]
    assert draft.committed_text == "h" and draft.completion_tokens == 2 and draft.prompt_tokens == 7


def test_end_at_stop_ends_the_answer_before_the_stop_string() -> None:
    pieces = (DraftPiece("Hello", True), DraftPiece(" there", True), DraftPiece(" you", False))
    stopped = end_at_stop(Draft(step=3, pieces=pieces), ("ere", "zzz"))
    assert stopped is not None and stopped.text == "Hello th" and stopped.finish_reason == "stop" and stopped.done
    assert end_at_stop(Draft(step=3, pieces=pieces), ("you",)) is None  # " you" is only a guess so far


def test_stream_chat_yields_drafts_until_done(bert_folder: Path) -> None:
    model = chat_model(bert_folder, steps_per_block=4)
    assert isinstance(model, ChatModel)
    drafts = list(model.stream_chat([ChatMessage("user", "hello there")], GenerationOptions(max_new_tokens=10)))
    assert drafts[-1].done and all(not d.done for d in drafts[:-1])
    assert len(drafts[-1].refinement.tokens) <= 16  # 10 rounded up to two blocks of 8
    assert [d.step for d in drafts] == list(range(len(drafts)))
    assert drafts[-1].prompt_tokens == len(model.prompt_ids([ChatMessage("user", "hello there")]))
    committed_counts = [d.completion_tokens for d in drafts]
    assert committed_counts == sorted(committed_counts) and committed_counts[0] > 0


def test_stop_string_ends_the_answer_once_committed(bert_folder: Path) -> None:
    model = chat_model(bert_folder, steps_per_block=8)
    messages = [ChatMessage("user", "what is your name")]
    full = list(model.stream_chat(messages, GenerationOptions(max_new_tokens=16, seed=0)))[-1]
    words = full.committed_text.split()
    assert len(words) >= 3
    stop = words[2]
    stopped = list(model.stream_chat(messages, GenerationOptions(max_new_tokens=16, seed=0, stop=(stop,))))
    assert stopped[-1].finish_reason == "stop"
    assert stopped[-1].text == full.committed_text[: full.committed_text.index(stop)]
    assert len(stopped) <= len(list(model.stream_chat(messages, GenerationOptions(max_new_tokens=16, seed=0))))


def test_empty_chat_is_a_model_error(bert_folder: Path) -> None:
    with pytest.raises(ModelError, match="empty"):
        list(chat_model(bert_folder).stream_chat([ChatMessage("user", "  ")], GenerationOptions()))


class LoggingDenoiser(MaskedLMDenoiser):
    """The real adapter, recording which thread ran each pass (a fresh log per test, see the fixture below)."""

    log: ClassVar[list[str]] = []

    def block_logits(self, canvas, lo, hi):
        self.log.append(threading.current_thread().name)
        return super().block_logits(canvas, lo, hi)


class EndlessDenoiser(MaskedLMDenoiser):
    """The real adapter whose end-of-answer id lies outside the vocabulary: it can never be written, so only
    `max_new_tokens` can end an answer."""

    def __init__(self, model, mask_id, eos_ids) -> None:
        super().__init__(model, mask_id, frozenset({int(model.config.vocab_size)}))


def test_an_external_checkpoint_reports_no_prompt_tokens_cached(bert_folder: Path) -> None:
    chat = [ChatMessage("user", "hello there")]
    plain = list(chat_model(bert_folder, steps_per_block=4).stream_chat(chat, GenerationOptions(max_new_tokens=8)))
    assert plain[-1].cached_prompt_tokens == 0  # its back end keeps no cache between answers: it encodes the prompt


@pytest.fixture(autouse=True)
def fresh_pass_log():
    """The pass log is shared by every LoggingDenoiser: start each test with it empty, whatever ran before."""
    LoggingDenoiser.log.clear()
    yield
    LoggingDenoiser.log.clear()


def test_concurrent_callers_queue_instead_of_interleaving(bert_folder: Path) -> None:
    model = chat_model(bert_folder, LoggingDenoiser, steps_per_block=8)
    results: dict[str, Draft] = {}

    def ask(name: str) -> None:
        *_, last = model.stream_chat([ChatMessage("user", "hi")], GenerationOptions(max_new_tokens=16, seed=1))
        results[name] = last

    threads = [threading.Thread(target=ask, args=(name,), name=name) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    log = LoggingDenoiser.log
    switches = sum(1 for a, b in itertools.pairwise(log) if a != b)
    assert switches == 1  # one whole answer, then the other
    assert results["first"].text == results["second"].text  # same seed, same answer, no shared-state corruption


def test_max_new_tokens_is_a_hard_cap_although_blocks_are_longer(bert_folder: Path) -> None:
    model = chat_model(bert_folder, EndlessDenoiser, steps_per_block=8)
    messages = [ChatMessage("user", "hello how are you")]
    drafts = list(model.stream_chat(messages, GenerationOptions(max_new_tokens=5, seed=0)))
    final = drafts[-1]
    assert final.done and final.finish_reason == "length"
    assert final.completion_tokens == 5 and len(final.pieces) == 5


def test_an_answer_cancelled_while_queued_for_the_model_computes_nothing(bert_folder: Path) -> None:
    model = chat_model(bert_folder, LoggingDenoiser, steps_per_block=8)
    cancel = threading.Event()
    drafts: list[Draft] = []
    holder = model.stream_chat([ChatMessage("user", "hi")], GenerationOptions(max_new_tokens=16, seed=1))
    next(holder)  # this answer now holds the model
    waiter = threading.Thread(
        target=lambda: drafts.extend(
            model.stream_chat([ChatMessage("user", "hello")], GenerationOptions(max_new_tokens=16), cancel)
        )
    )
    waiter.start()
    cancel.set()  # the session went away while its answer waited
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert [(d.done, d.finish_reason, d.text) for d in drafts] == [(True, "cancelled", "")]
    passes = len(LoggingDenoiser.log)
    holder.close()  # the running answer releases the model; the cancelled one never ran a pass
    assert len(LoggingDenoiser.log) == passes == 1
    assert list(model.stream_chat([ChatMessage("user", "hi")], GenerationOptions(max_new_tokens=8)))[-1].done


STRADDLING = "Café au lait. Très bien, merci!"  # bytes of "é" are tokens 3 and 4: across the end of the first block


def assert_committed_text_is_final(drafts: list[Draft]) -> None:
    final = drafts[-1].text
    previous = ""
    for draft in drafts:
        committed = draft.committed_text
        assert "\ufffd" not in draft.text, f"pass {draft.step} shows half a character: {draft.text!r}"
        assert committed.startswith(previous) and final.startswith(committed), (draft.step, committed, previous)
        previous = committed


def test_a_character_split_by_a_block_end_is_committed_only_whole() -> None:
    model = scripted_byte_model(STRADDLING, block_length=4)
    drafts = list(model.stream_chat([ChatMessage("user", "hi")], GenerationOptions(max_new_tokens=64)))
    # the pass that finishes the first block ends on the first byte of "é": it must not be shown yet
    block_end = next(d for d in drafts if len(d.refinement.tokens) == 4 and d.refinement.committed_prefix == 4)
    assert block_end.committed_text == "Caf"
    assert_committed_text_is_final(drafts)
    assert drafts[-1].text == STRADDLING and drafts[-1].finish_reason == "stop"


def test_a_character_before_an_end_of_sequence_guess_is_held_back() -> None:
    model = scripted_byte_model(STRADDLING, block_length=8, eos_ahead=True)  # every draft ends in an EOS guess
    drafts = list(model.stream_chat([ChatMessage("user", "hi")], GenerationOptions(max_new_tokens=64)))
    half = next(d for d in drafts if d.refinement.committed_prefix == 4)  # "Caf" and the first byte of "é"
    assert half.text == half.committed_text == "Caf"
    assert_committed_text_is_final(drafts)
    assert drafts[-1].text == STRADDLING


def test_an_unfinished_character_shows_only_when_the_answer_ends_on_it() -> None:
    tokenizer = byte_tokenizer()
    caf, first_byte = tokenizer.encode("Caf"), tokenizer.encode("é")[0]
    tokens = (*caf, first_byte)

    def refinement(done: bool, reason: str = "length") -> Refinement:
        return Refinement(step=0, block=0, tokens=tokens, committed=(True,) * 4, confidence=(1.0,) * 4,
                          elapsed_s=0.0, done=done, finish_reason=reason if done else None,
                          eos_ids=frozenset({BYTE_EOS}))

    assert draft_from_refinement(tokenizer, refinement(False), 1).committed_text == "Caf"
    assert draft_from_refinement(tokenizer, refinement(True), 1).text == "Caf\ufffd"  # final: nothing will complete it
    assert draft_from_refinement(tokenizer, refinement(True, "cancelled"), 1).text == "Caf"  # cut short: not shown
    cut = draft_from_refinement(tokenizer, refinement(False), 1, limit=4)  # the max_tokens cut ends the answer too
    assert cut.done and cut.finish_reason == "length" and cut.text == "Caf\ufffd"


@pytest.mark.parametrize(("max_tokens", "reason", "text"), [(3, "length", "hel"), (5, "stop", "hello")])
def test_finish_reason_is_length_when_max_tokens_cut_the_answer(max_tokens: int, reason: str, text: str) -> None:
    # one pass commits the whole block of 8, EOS included: the sampler itself reports "stop"
    model = scripted_byte_model("hello", block_length=8, steps_per_block=1)
    final = list(model.stream_chat([ChatMessage("user", "hi")], GenerationOptions(max_new_tokens=max_tokens)))[-1]
    assert final.refinement.finish_reason == "stop"
    assert (final.finish_reason, final.text, final.completion_tokens) == (reason, text, len(text))


def test_usage_after_a_stop_string_counts_only_the_tokens_returned() -> None:
    model = scripted_byte_model(STRADDLING, block_length=4)
    options = GenerationOptions(max_new_tokens=64, stop=(" au",))
    final = list(model.stream_chat([ChatMessage("user", "hi")], options))[-1]
    assert final.text == "Café" and final.finish_reason == "stop"
    assert final.completion_tokens == 5  # "C", "a", "f" and the two bytes of "é"; not " au" nor what followed


def test_prompt_and_answer_beyond_the_context_are_refused_before_the_model_is_touched() -> None:
    model = scripted_byte_model("hi", block_length=4, context_length=32)
    model.check_context(20, 9)  # 9 tokens are computed as 3 blocks: 20 + 12 = 32 fits
    with pytest.raises(ContextLengthExceeded, match=r"maximum context length is 32 tokens.*33 tokens"):
        model.check_context(21, 9)
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 16 tokens"):
        model.check_context(13, 4, limit=16)  # a server's own cap, smaller than the model's
    long_chat = [ChatMessage("user", "x" * 40)]
    with pytest.raises(ContextLengthExceeded):
        model.stream_chat(long_chat, GenerationOptions(max_new_tokens=4))  # raised at the call, before any pass
    assert model.backend.denoiser.prompts == []


def test_cancel_during_a_long_prefill_stops_between_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    import model.runtime.batching as batching
    from model.bundled.backend import BlockDiffusionBackend
    from tests.unit.test_block_diffusion import EOS, adapted

    network = adapted()
    denoiser = BlockDiffusionBackend(network, [EOS])
    model = DiffusionChatModel("tiny-llama", byte_tokenizer(), denoiser, SamplerConfig(4, 4))
    monkeypatch.setattr(batching, "PREFILL_CHUNK", 32)
    cancel = threading.Event()
    chunks: list[int] = []
    runner = network.inference_pass()

    def counting(input_ids, *args, **kwargs):
        chunks.append(input_ids.shape[1])
        cancel.set()  # the client leaves while the first chunk is encoded
        return runner(input_ids, *args, **kwargs)

    monkeypatch.setattr(network, "inference_pass", lambda: counting)
    prompt = [5 + i % 40 for i in range(200)]  # seven chunks of 32
    drafts = list(model.stream_prompt(prompt, GenerationOptions(max_new_tokens=4), cancel))
    assert [(d.done, d.finish_reason) for d in drafts] == [(True, "cancelled")]
    assert chunks == [32]  # stopped before the second chunk
    monkeypatch.setattr(network, "inference_pass", lambda: runner)
    assert list(model.stream_prompt(prompt, GenerationOptions(max_new_tokens=4)))[-1].done  # the model is free
