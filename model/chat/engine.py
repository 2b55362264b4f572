"""`DiffusionChatModel`: a tokenizer, a network and a `SamplerConfig` behind the `ChatModel` interface.

It applies the tokenizer's chat template, runs the decoding and turns each `Refinement` into a `Draft` whose pieces
say which text is final. The HTTP server and voice sessions share one model. On a block-diffusion model (the bundled
one) every answer, in every decoding mode, is a step object (`sequence`) that the model's batch runner drives
(model/runtime/batch_runner.py): each pass of every answer in flight is one batched forward. External checkpoints
(`Denoiser`s that cannot batch) run the sampler's `generate`, one answer at a time behind a fair lock; concurrent
callers queue.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from model.chat import ChatMessage, Draft, DraftPiece, GenerationOptions
from model.chat.stop_strings import end_at_stop
from model.decoding.block_passes import BlockPasses, DiffusionSequence
from model.decoding.denoiser import Denoiser, Forkable, ReportsReusedTokens
from model.decoding.draft_policy import DraftPolicy
from model.decoding.end_of_turn import EndOfTurnProbe, message_tail, probe_row
from model.decoding.refinement import Refinement
from model.decoding.sampler import DiffusionDecoding, SamplerConfig, generate, validate_request
from model.decoding.speculative import SpeculativeDecoding
from model.decoding.speech_guard import SpeechGuard, WordClasses
from model.decoding.step import DecodingSequence
from model.errors import ContextLengthExceeded, GenerationCancelled, ModelError
from model.fair_lock import FairLock
from model.runtime.batch_runner import Batching
from model.runtime.batching import common_prefix

# Tokens decoded again on each side of a piece: enough for byte-level BPE and SentencePiece to merge a multi-byte
# character or restore a leading space the same way they would in the whole text.
DECODE_CONTEXT = 4


def token_texts(tokenizer: Any, tokens: Sequence[int], final: bool = False) -> list[str]:
    """Text of each token, decoded incrementally so characters spanning several tokens come out whole.

    A token whose text ends inside an unfinished UTF-8 character gets "" and the character goes to the token that
    completes it (the streaming-detokenizer trick: decode a short window and take what it adds). The last token is
    held back the same way unless `final` (the answer ends there): its completing token may simply not be drafted yet
    (a block end, a `max_tokens` cut, an end-of-sequence guess), and text once shown must not turn from "\ufffd" into
    a character later. A token's text depends only on the tokens up to it, so committed text never changes.
    """
    texts: list[str] = []
    emitted = 0  # first token whose text has not been emitted yet
    for index in range(len(tokens)):
        left = max(0, emitted - DECODE_CONTEXT)
        before = tokenizer.decode(list(tokens[left:emitted]))
        after = tokenizer.decode(list(tokens[left : index + 1]))
        if after.endswith("\ufffd") and (index + 1 < len(tokens) or not final):
            texts.append("")
            continue
        texts.append(after[len(before) :] if after.startswith(before) else after)
        emitted = index + 1
    return texts


def token_texts_of_vocabulary(tokenizer: Any) -> list[str]:
    """Each token's text alone, by id."""
    return tokenizer.batch_decode([[token_id] for token_id in range(len(tokenizer))])


def sentence_end_ids(tokenizer: Any, texts: list[str] | None = None) -> frozenset[int]:
    """Tokens whose text ends a sentence ("." "!" "?", optionally followed by a quote or spaces)."""
    texts = token_texts_of_vocabulary(tokenizer) if texts is None else texts
    stripped = (text.rstrip(" \"')\n") for text in texts)
    return frozenset(i for i, text in enumerate(stripped) if text.endswith((".", "!", "?")) and not text.endswith(".."))


def punctuation_ids(texts: list[str]) -> frozenset[int]:
    """Tokens that are punctuation alone (".", "?", "...", ",", '"', " -"...): what a transcript may end with after
    its last word."""
    return frozenset(i for i, text in enumerate(texts)
                     if text.strip() and not any(ch.isalnum() or ch.isspace() for ch in text.strip()))


@dataclasses.dataclass(frozen=True, slots=True)
class Vocabulary:
    """What the guards and the end-of-turn probe need to know of a tokenizer's tokens; scanned once per model."""

    sentence_ends: frozenset[int]
    punctuation: frozenset[int]
    sentence_marks: frozenset[int]  # punctuation alone that ends a sentence: "." "?" "!" "?!"...
    words: WordClasses

    @classmethod
    def scan(cls, tokenizer: Any) -> Vocabulary:
        texts = token_texts_of_vocabulary(tokenizer)
        ends, punctuation = sentence_end_ids(tokenizer, texts), punctuation_ids(texts)
        return cls(ends, punctuation, ends & punctuation, WordClasses.from_texts(texts))


def draft_from_refinement(
    tokenizer: Any, refinement: Refinement, prompt_tokens: int, limit: int | None = None
) -> Draft:
    """Pieces up to the first end-of-sequence guess (and at most `limit` tokens); a piece is committed when every
    token it holds is.

    The draft is done when the pass is, or when the first `limit` tokens are all committed: the answer is then cut at
    `max_tokens`, and its finish reason is "length" unless it really ended there (a committed end-of-sequence right
    after the last token kept).
    """
    end = next((i for i, token in enumerate(refinement.tokens) if token in refinement.eos_ids), len(refinement.tokens))
    cut = end if limit is None else min(end, limit)
    reached_limit = limit is not None and refinement.committed_prefix >= limit
    done = refinement.done or reached_limit
    finish_reason = refinement.finish_reason
    if reached_limit and not (refinement.finish_reason == "stop" and refinement.answer_length <= limit):
        finish_reason = "length"
    tokens = refinement.tokens[:cut]
    pieces: list[DraftPiece] = []
    group_committed, group_tokens = True, 0
    ends_here = done and finish_reason != "cancelled"  # a cancelled answer was cut short, not ended: keep holding
    for index, text in enumerate(token_texts(tokenizer, tokens, final=ends_here)):
        group_committed = group_committed and refinement.committed[index]
        group_tokens += 1
        if text == "" and index + 1 < len(tokens):
            continue  # part of a character completed by a later token
        pieces.append(DraftPiece(text, group_committed, refinement.confidence[index], group_tokens))
        group_committed, group_tokens = True, 0
    return Draft(
        step=refinement.step,
        pieces=tuple(pieces),
        done=done,
        finish_reason=finish_reason,
        elapsed_s=refinement.elapsed_s,
        prompt_tokens=prompt_tokens,
        completion_tokens=sum(refinement.committed[:cut]),
        refinement=refinement,
        end_of_turn=refinement.end_of_turn,
    )


def context_length_of(config: Any) -> int | None:
    """The number of positions a transformers config says its model was built for (None when it does not say)."""
    for source in (config, getattr(config, "text_config", None)):
        value = getattr(source, "max_position_embeddings", None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class DiffusionChatModel:
    """A local diffusion LM as a `ChatModel`. Thread-safe: concurrent answers share batched passes when the network
    offers a `batch_runner` (block-diffusion models); otherwise one answer at a time, callers queue."""

    def __init__(
        self,
        name: str,
        tokenizer: Any,
        denoiser: Denoiser | Batching | None,
        sampler: SamplerConfig,
        system_prompt: str | None = None,
        context_length: int | None = None,
        max_batch: int | None = None,
    ) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.denoiser = denoiser
        self.sampler = sampler
        self.system_prompt = system_prompt
        self.context_length = context_length  # positions the network was built for; None: not known, not checked
        batching = isinstance(denoiser, Batching)
        if sampler.decoding != "diffusion" and not batching:
            raise ModelError(
                f"{name} cannot decode {sampler.decoding}: that needs a block-diffusion model with a gated adapter "
                "(clean tokens see exactly the autoregressive teacher); use --decoding diffusion"
            )
        # Guards by their rules, built on first use; the vocabulary scan they need is done once for all
        self._guards: dict[tuple[int, int, int, int], SpeechGuard] = {}
        self._vocabulary: Vocabulary | None = None
        self._message_tail: tuple[int, ...] | None = None  # built on first use (`message_tail`)
        self._draft_policies: dict[int, DraftPolicy] = {}
        self._policies_lock = threading.Lock()
        # classifier-free guidance needs a second state over the same weights (`Forkable`); the batch runner keeps one
        # state per answer, and guidance is a masked sampler's tool, so a block-diffusion model refuses it
        if sampler.cfg_scale > 0 and batching:
            raise ModelError(f"{name} does not support classifier-free guidance (cfg_scale): set it to 0")
        self._unconditional = denoiser.fork() if sampler.cfg_scale > 0 and isinstance(denoiser, Forkable) else None
        self._lock = FairLock()  # without batching, sessions take turns on the model, first come, first served
        # Every answer of a block-diffusion model runs through its runner, in every mode. `max_batch`: answers per
        # pass (None: the runner's default; 1: one at a time, still through the runner).
        if max_batch is not None and max_batch < 1:
            raise ModelError(f"max_batch must be at least 1, got {max_batch}")
        self._runner = denoiser.batch_runner(max_batch) if batching else None

    @property
    def max_batch(self) -> int:
        """How many answers this model decodes at once (1: one at a time)."""
        return self._runner.max_batch if self._runner is not None else 1

    def stop_batching(self) -> None:
        """End the batch runner's thread (answers it is decoding end with an error; later ones are refused). For a
        benchmark that times passes on its own thread: the runner's thread keeps an OpenMP team (it ran the draft
        calibration at load), and two teams on two cores slow every pass 2-3x (model/runtime/passing_thread.py)."""
        if self._runner is not None:
            self._runner.close()

    def prompt_ids(self, messages: Sequence[ChatMessage], system_prompt: str | None = None) -> list[int]:
        """Token ids of the chat, formatted by the tokenizer's chat template and ending where the answer starts.
        A chat without a system message gets `system_prompt`, else the model's own default (if any)."""
        chat = [{"role": m.role, "content": m.content} for m in messages]
        system_prompt = system_prompt or self.system_prompt
        if system_prompt and not any(m.role == "system" for m in messages):
            chat.insert(0, {"role": "system", "content": system_prompt})
        if not any(m["content"].strip() for m in chat if m["role"] != "system"):
            raise ModelError("the chat is empty: nothing to answer")
        if getattr(self.tokenizer, "chat_template", None):
            from jinja2 import TemplateError

            try:
                text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            except TemplateError as error:  # e.g. a template that demands alternating user/assistant roles
                raise ModelError(f"the model's chat template refuses this chat: {error}") from error
        else:  # plain masked LMs (BERT) ship no template
            text = "".join(f"{m['role']}: {m['content']}\n" for m in chat) + "assistant:"
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prepare(
        self, messages: Sequence[ChatMessage], cancel: threading.Event | None = None, conversation: str | None = None,
        system_prompt: str | None = None,
    ) -> list[int]:
        """Encode, while the model is idle, the part of the next prompt that does not depend on the user's next
        words: `messages` (what the next answer will see before them) and the user header. A voice session calls it
        when an answer ends, so the next turn's prefill, on its critical path, encodes only the new words (turn 2-10
        of a conversation re-encoded 57-87 tokens: the one-exchange history window slides every turn), into the
        cache slot kept for `conversation` (`GenerationOptions.conversation`). `cancel` drops it if it is still
        waiting. `system_prompt` is the one the next answer will ask for (`GenerationOptions.system_prompt`).
        Returns the tokens queued (none without a batch runner)."""
        if self._runner is None:
            return []
        self.vocabulary()  # scanned here, while idle, rather than on the next answer's critical path
        shared = self.next_prompt_prefix(messages, system_prompt)
        if shared:
            self._runner.prepare(shared, cancel, conversation)
        return shared

    def next_prompt_prefix(self, messages: Sequence[ChatMessage], system_prompt: str | None = None) -> list[int]:
        """The tokens every prompt of `messages` plus one more user message starts with, whatever its words."""
        one = self.prompt_ids([*messages, ChatMessage("user", "a")], system_prompt)
        other = self.prompt_ids([*messages, ChatMessage("user", "b")], system_prompt)
        return one[: common_prefix(one, other)]

    def sampler_for(self, options: GenerationOptions) -> tuple[SamplerConfig, int]:
        """This answer's sampler config (the model's, with the caller's temperature, seed and `AnswerRules`) and its
        length, rounded up to a whole number of blocks."""
        if options.max_new_tokens < 1:
            raise ModelError(f"max_new_tokens must be at least 1, got {options.max_new_tokens}")
        rules = options.rules
        config = dataclasses.replace(
            self.sampler, temperature=options.temperature, seed=options.seed, no_repeat_ngram=rules.no_repeat_ngram,
            end_after=rules.end_after, no_copy_ngram=rules.no_copy_ngram, no_copy_opening=rules.no_copy_opening,
        )
        blocks = -(-options.max_new_tokens // config.block_length)
        return config, blocks * config.block_length

    def check_context(self, prompt_tokens: int, max_new_tokens: int, limit: int | None = None) -> None:
        """Raise `ContextLengthExceeded` when the prompt and the answer do not fit the model's context, or `limit`
        (a server's own cap) when that is smaller. The answer counts as the sampler computes it: whole blocks."""
        budgets = [size for size in (self.context_length, limit) if size is not None]
        if not budgets:
            return
        context = min(budgets)
        block = self.sampler.block_length
        answer = -(-max(max_new_tokens, 1) // block) * block
        if prompt_tokens + answer <= context:
            return
        rounded = f", rounded up to whole blocks of {block}" if answer != max_new_tokens else ""
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + answer} tokens ({prompt_tokens} in the messages, {answer} in the completion{rounded}). "
            "Please reduce the length of the messages or completion."
        )

    def stream_chat(
        self,
        messages: Sequence[ChatMessage],
        options: GenerationOptions,
        cancel: threading.Event | None = None,
    ) -> Iterator[Draft]:
        """One `Draft` per pass; the last has done=True. Stop strings end the answer once they are committed."""
        return self.stream_prompt(self.prompt_ids(messages, options.system_prompt), options, cancel)

    def stream_prompt(
        self, prompt: Sequence[int], options: GenerationOptions, cancel: threading.Event | None = None
    ) -> Iterator[Draft]:
        """`stream_chat` for a tokenized prompt. Refuses (`ModelError`) before taking the model's lock."""
        prompt = list(prompt)
        config, length = self.sampler_for(options)
        self.check_context(len(prompt), options.max_new_tokens)
        return self._drafts(prompt, options, config, length, cancel)

    def _drafts(
        self, prompt: list[int], options: GenerationOptions, config: SamplerConfig, length: int,
        cancel: threading.Event | None,
    ) -> Iterator[Draft]:
        cancelled = Draft(step=0, pieces=(), done=True, finish_reason="cancelled", prompt_tokens=len(prompt))
        refinements, reused = self._answer(prompt, length, config, cancel, options.interactive, options.conversation)
        try:
            for refinement in refinements:
                draft = draft_from_refinement(self.tokenizer, refinement, len(prompt), options.max_new_tokens)
                # read after the first pass: the prompt is encoded when the answer starts
                draft = dataclasses.replace(draft, cached_prompt_tokens=reused())
                stopped = end_at_stop(draft, options.stop) if options.stop else None
                yield stopped or draft
                if stopped is not None or draft.done:
                    return
        except GenerationCancelled:  # cancelled while waiting for the model or during the prompt's prefill
            yield cancelled
        finally:
            refinements.close()  # type: ignore[attr-defined]  # frees the model (lock or batch slot) at once

    def answer_refinements(
        self, prompt: list[int], length: int, config: SamplerConfig, cancel: threading.Event | None = None
    ) -> Iterator[Refinement]:
        """The passes of one answer as `stream_chat` runs them (through the batch runner when the model has one),
        for a caller that reads the tokens of each pass: the benchmarks measure the loop that runs."""
        return self._answer(prompt, length, config, cancel, False, None)[0]

    def _answer(
        self, prompt: list[int], length: int, config: SamplerConfig, cancel: threading.Event | None,
        interactive: bool, conversation: str | None,
    ) -> tuple[Iterator[Refinement], Callable[[], int]]:
        """The answer's passes, and how many prompt tokens it found already encoded (read after the first pass)."""
        if self._runner is not None:
            run = self._runner.submit(self.sequence(prompt, length, config), interactive, cancel, conversation)
            return iter(run), lambda: run.reused_tokens
        denoiser = self.denoiser
        return (
            self._locked_refinements(prompt, length, config, cancel),
            lambda: denoiser.reused_tokens if isinstance(denoiser, ReportsReusedTokens) else 0,
        )

    def _locked_refinements(
        self, prompt: list[int], length: int, config: SamplerConfig, cancel: threading.Event | None
    ) -> Iterator[Refinement]:
        if not self._lock.acquire(cancel):  # cancelled while other answers held the model: nothing was computed
            raise GenerationCancelled("cancelled while waiting for the model")
        try:
            yield from self.refinements(prompt, length, config, cancel)
        finally:
            self._lock.release()

    def sequence(self, prompt: list[int], length: int, config: SamplerConfig) -> DecodingSequence:
        """This answer's decoding as a step function for the batch runner (model/runtime/batch_runner.py).
        Without the cache (`use_cache` False, for comparisons) diffusion passes re-encode the prompt every time; the
        other modes refuse."""
        denoiser = self.denoiser
        sequence: DecodingSequence
        if config.decoding == "diffusion":
            validate_request(denoiser, prompt, length, config)
            guard = self.speech_guard(config, prompt)
            decoding = DiffusionDecoding(denoiser.mask_id, denoiser.eos_ids, length, config, guard)
            passes = BlockPasses(prompt, denoiser.model.vocab_size, cached=config.use_cache)
            sequence = DiffusionSequence(decoding, passes)
        elif not config.use_cache:
            raise ModelError(f"{config.decoding} decoding needs the KV cache (drop --no-cache)")
        else:
            masks = config.draft_masks if config.decoding == "self-speculative" else 0
            sequence = SpeculativeDecoding(
                prompt, length, masks, denoiser.mask_id, denoiser.eos_ids, config.temperature, config.seed,
                self.speech_guard(config, prompt), config.draft_branches, self.draft_policy(config),
            )
        tail = self.message_tail()
        row = probe_row(prompt, tail, self.vocabulary().punctuation) if tail else None
        if row is None:
            return sequence
        return EndOfTurnProbe(sequence, prompt, row, self.message_end_ids())

    def message_end_ids(self) -> tuple[int, ...]:
        """What may follow the user's last word when the message ends there: the template's end-of-message token,
        or a mark that ends the sentence ("." "?" "!", alone)."""
        return tuple(sorted({self.message_tail()[0], *self.vocabulary().sentence_marks}))

    def vocabulary(self) -> Vocabulary:
        """The tokenizer's scanned vocabulary, once for all guards and probes (~0.6 s for SmolLM2's 49k tokens)."""
        if self._vocabulary is None:
            self._vocabulary = Vocabulary.scan(self.tokenizer)
        return self._vocabulary

    def message_tail(self) -> tuple[int, ...]:
        """What the chat template puts after a user message's words up to the answer (for SmolLM2 `<|im_end|>`,
        a newline and the assistant header): where the end-of-turn probe reads (model/decoding/end_of_turn.py). Empty
        without a chat template, or when the template does not end the message with the tokenizer's EOS."""
        if self._message_tail is None:
            tail: tuple[int, ...] | None = None
            end_id = getattr(self.tokenizer, "eos_token_id", None)
            if getattr(self.tokenizer, "chat_template", None) and end_id is not None:
                words = list(self.tokenizer.encode(" Is it done", add_special_tokens=False))
                tail = message_tail(self.prompt_ids([ChatMessage("user", "Is it done")]), words[-1:])
            self._message_tail = tail if tail and tail[0] == end_id else ()
        return self._message_tail

    def refinements(
        self, prompt: list[int], length: int, config: SamplerConfig, cancel: threading.Event | None
    ) -> Iterator[Refinement]:
        """The passes of one answer of a denoiser that cannot batch (external checkpoints: the sampler's `generate`,
        one answer at a time); models that are not masked (DiffusionGemma) override this."""
        guard = self.speech_guard(config, prompt)
        return generate(self.denoiser, prompt, length, config, cancel, self._unconditional, guard)

    def draft_policy(self, config: SamplerConfig) -> DraftPolicy | None:
        """The model's shared draft policy for `config` (one per mask count: what it learns about pass costs and
        acceptance holds for every answer), or None when the layout is fixed."""
        if config.decoding != "self-speculative" or config.draft_layout != "adaptive":
            return None
        with self._policies_lock:
            return self._draft_policies.setdefault(config.draft_masks, DraftPolicy(config.draft_masks))

    def speech_guard(self, config: SamplerConfig, prompt: list[int] | None = None) -> SpeechGuard | None:
        """The anti-loop rules `config` asks for (its answer's `AnswerRules`), with this tokenizer's word classes and
        sentence-end tokens, for `prompt` (None when every rule is off)."""
        rules = (config.no_repeat_ngram, config.end_after, config.no_copy_ngram, config.no_copy_opening)
        if not any(rules):
            return None
        with self._policies_lock:
            guard = self._guards.get(rules)
            if guard is None:
                guard = self._guards[rules] = self._new_guard(config)
        return guard if prompt is None else guard.for_prompt(prompt)

    def _new_guard(self, config: SamplerConfig) -> SpeechGuard:
        vocabulary = self.vocabulary()
        sentence_ends, words = vocabulary.sentence_ends, vocabulary.words
        copying = config.no_copy_ngram or config.no_copy_opening
        return SpeechGuard(
            no_repeat_ngram=config.no_repeat_ngram,
            end_after=config.end_after,
            sentence_end_ids=sentence_ends if config.end_after else frozenset(),
            eos_id=self.tokenizer.eos_token_id,
            words=words if config.no_repeat_ngram or copying else None,
            no_copy_ngram=config.no_copy_ngram,
            no_copy_opening=config.no_copy_opening,
        )

    def generate_text(self, prompt: str, options: GenerationOptions | None = None) -> str:
        """The final answer to one user message, as plain text."""
        drafts = list(self.stream_chat([ChatMessage("user", prompt)], options or GenerationOptions()))
        return drafts[-1].text
