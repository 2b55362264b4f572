"""The LM's end-of-turn probability (model/decoding/end_of_turn.py) on a tiny random block-diffusion Llama in fp32:
the value
the answer's first pass reports is the teacher's own P(the message ends) after the user's last word, in every decoding
mode, whether the words were folded into the first pass or prefilled, and the answer is the same as without it."""

from __future__ import annotations

from model.bundled.backend import BlockDiffusionBackend
from model.chat import ChatMessage, GenerationOptions
from model.chat.engine import DiffusionChatModel
from model.decoding.end_of_turn import end_probability, message_tail, probe_row
from model.runtime.batching import SlotCache, prefill
from scripts.report_lib.tiny_models import word_tokenizer
from tests.unit.drive import sequence
from tests.unit.test_batching import MODES
from tests.unit.test_self_speculative import adapted, one_thread  # noqa: F401  (autouse: tiny tensors, 1 thread)

# the message ends with the tokenizer's EOS, as ChatML's <|im_end|> does
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


def chat_model(decoding: str, template: str | None = TEMPLATE) -> DiffusionChatModel:
    tokenizer = word_tokenizer()
    tokenizer.add_tokens([".", "?", ","])  # ids the tiny Llama's vocabulary still has
    tokenizer.chat_template = template
    return DiffusionChatModel("tiny", tokenizer, BlockDiffusionBackend(adapted(), [tokenizer.eos_token_id]),
                              MODES[decoding])


def teacher_probability(chat: DiffusionChatModel, prompt: list[int], row: int) -> float:
    """P(EOS, "." or "?") after prompt[: row + 1] from a plain prefill of those tokens alone, on a fresh cache."""
    _, logits = prefill(chat.backend.model, SlotCache(1), 0, prompt[: row + 1])
    assert logits is not None
    ends = [chat.tokenizer.eos_token_id, *chat.tokenizer.convert_tokens_to_ids([".", "?"])]
    return end_probability(logits, ends)


def first_draft(chat: DiffusionChatModel, words: str, prepared: bool):
    messages = [ChatMessage("user", words)]
    if prepared:  # a voice session encodes the prompt's known part ahead: the words are folded into the first pass
        list(chat.backend.runner.prepare(chat.next_prompt_prefix([]), owner="c"))
    options = GenerationOptions(max_new_tokens=8, interactive=True, conversation="c")
    drafts = list(chat.stream_chat(messages, options))
    return drafts, chat.prompt_ids(messages)


def test_the_tail_after_a_user_message_is_found_and_read_after_the_last_word() -> None:
    chat = chat_model("self-speculative")
    tail = chat.message_tail()
    assert tail == tuple(chat.tokenizer.encode("<eos> assistant :", add_special_tokens=False))
    prompt = chat.prompt_ids([ChatMessage("user", "how are you")])
    assert probe_row(prompt, tail) == len(prompt) - len(tail) - 1
    assert chat.tokenizer.decode([prompt[probe_row(prompt, tail)]]) == "you"
    assert probe_row(prompt[:-1], tail) is None  # not a chat prompt ending where the answer starts
    assert message_tail([1, 2, 3], [9]) is None
    # the marks Whisper wrote after the last word are skipped: the row predicts whether the sentence ends there
    punctuation = chat.vocabulary().punctuation
    assert set(chat.tokenizer.convert_ids_to_tokens(sorted(punctuation))) == {":", ".", "?", ","}
    for words in ("how are you ?", "how are you . . .", "how are you ,"):
        marked = chat.prompt_ids([ChatMessage("user", words)])
        assert chat.tokenizer.decode([marked[probe_row(marked, tail, punctuation)]]) == "you", words
    ends = chat.message_end_ids()
    assert chat.tokenizer.convert_ids_to_tokens(list(ends)) == ["<eos>", ".", "?"]  # not ",": the sentence goes on


def test_every_mode_reports_the_teachers_end_of_message_probability_folded_or_prefilled() -> None:
    short = "hello how are you ?"
    long = " ".join(["what is your name", "the cat", "the dog", "good day"] * 4)  # more words than a pass folds
    for decoding in MODES:
        for words, prepared in ((short, True), (long, True), (short, False)):
            chat = chat_model(decoding)
            drafts, prompt = first_draft(chat, words, prepared)
            row = probe_row(prompt, chat.message_tail(), chat.vocabulary().punctuation)
            assert chat.tokenizer.decode([prompt[row]]) in ("you", "day"), (decoding, words)
            expected = teacher_probability(chat, prompt, row)
            assert drafts[0].end_of_turn is not None, (decoding, words, prepared)
            assert abs(drafts[0].end_of_turn - expected) < 1e-5, (decoding, words, prepared)
            assert all(draft.end_of_turn is None for draft in drafts[1:])  # the first pass only
            # the answer is the one the same model gives without a probe (no template tail: no probe)
            bare = chat_model(decoding)
            inner = sequence(bare, prompt, 8, MODES[decoding]).inner
            reference = list(bare.backend.runner.submit(inner, interactive=True))
            assert [r.tokens for r in reference][-1] == drafts[-1].refinement.tokens, (decoding, words)


def test_a_model_without_a_chat_template_reports_nothing() -> None:
    chat = chat_model("self-speculative", template=None)
    assert chat.message_tail() == ()
    drafts, _ = first_draft(chat, "hello how are you", prepared=False)
    assert all(draft.end_of_turn is None for draft in drafts)
    assert drafts[-1].done


def test_words_an_earlier_prompt_already_cached_are_read_again() -> None:
    # "how are you" after "how are you doing": the slot already holds the last word's key, but not its prediction
    for decoding in MODES:
        chat = chat_model(decoding)
        first_draft(chat, "how are you fine", prepared=True)
        drafts, prompt = first_draft(chat, "how are you", prepared=False)
        row = probe_row(prompt, chat.message_tail(), chat.vocabulary().punctuation)
        assert drafts[0].end_of_turn is not None, decoding
        assert abs(drafts[0].end_of_turn - teacher_probability(chat, prompt, row)) < 1e-5, decoding
