"""`DiffusionChatModel`: a tokenizer, a back end and the model's `SamplerConfig` behind the `ChatModel` interface.

The text layer of every local model: it applies the tokenizer's chat template, checks the context, plans each answer
(its length in whole blocks, the caller's guard, where the end-of-turn probe reads) and turns each `Refinement` of the
back end into a `Draft` whose pieces say which text is final. How the passes are computed, and how answers share the
network, is the back end's (model/chat/backend.py); the engine is the same for all of them. The HTTP server and voice
sessions share one model.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from model.chat import ChatMessage, Draft, GenerationOptions
from model.chat.backend import AnswerPlan, Backend, EndOfTurnRow
from model.chat.stop_strings import end_at_stop
from model.chat.text import TokenTexts, Vocabulary, draft_from_refinement
from model.chat.tools import renders_tools, template_chat
from model.decoding.call_formats import CallForm, forms_for
from model.decoding.end_of_turn import message_tail, probe_row
from model.decoding.grammar import Grammar, GrammarError, compile_format, compile_tools, grammar_tokenizer
from model.decoding.options import whole_blocks
from model.decoding.sampler import SamplerConfig
from model.decoding.speech_guard import SpeechGuard
from model.errors import ContextLengthExceeded, GenerationCancelled, ModelError
from model.runtime.batching import common_prefix


def context_length_of(config: Any) -> int | None:
    """The number of positions a transformers config says its model was built for (None when it does not say)."""
    for source in (config, getattr(config, "text_config", None)):
        value = getattr(source, "max_position_embeddings", None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class DiffusionChatModel:
    """A local diffusion LM as a `ChatModel`. Thread-safe: concurrent answers share batched passes when the back end
    batches (the bundled model); otherwise one answer at a time, callers queue."""

    def __init__(
        self,
        name: str,
        tokenizer: Any,
        backend: Backend,
        sampler: SamplerConfig,
        system_prompt: str | None = None,
        context_length: int | None = None,
        note: str | None = None,
    ) -> None:
        backend.check(sampler)
        self.name = name
        self.tokenizer = tokenizer
        self.backend = backend
        self.sampler = sampler
        self.system_prompt = system_prompt
        self.context_length = context_length  # positions the network was built for; None: not known, not checked
        # What a startup line says of how this model decodes when it is not what users of this runtime expect
        # (a GGUF model without a draft adapter decodes autoregressively); None: nothing to say
        self.note = note
        # Guards by their rules, built on first use; the vocabulary scan they need is done once for all
        self._guards: dict[tuple[int, int, int, int, bool], SpeechGuard] = {}
        self._vocabulary: Vocabulary | None = None
        self._message_tail: tuple[int, ...] | None = None  # built on first use (`message_tail`)
        self._guards_lock = threading.Lock()
        self._grammar_tokenizer: Any = None  # llguidance's view of the tokenizer, built on the first constrained answer
        self._renders_tools: bool | None = None  # whether the chat template writes tools its own way (on first use)

    @property
    def max_batch(self) -> int:
        """How many answers this model decodes at once (1: one at a time)."""
        return self.backend.max_batch

    def prompt_ids(self, messages: Sequence[ChatMessage], system_prompt: str | None = None) -> list[int]:
        """Token ids of the chat, formatted by the tokenizer's chat template and ending where the answer starts.
        A chat without a system message gets `system_prompt`, else the model's own default (if any). A template that
        renders tools (`renders_tools`) gets the offered functions, calls and results as its own `tools`,
        `tool_calls` and tool messages; any other writes them in the generic text format they arrive in."""
        system_prompt = system_prompt or self.system_prompt
        if system_prompt and not any(m.role == "system" for m in messages):
            messages = [ChatMessage("system", system_prompt), *messages]
        if not any(m.content.strip() for m in messages if m.role != "system"):
            raise ModelError("the chat is empty: nothing to answer")
        chat: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in messages]
        tools = None
        if self._renders_tools is None:
            self._renders_tools = renders_tools(getattr(self.tokenizer, "chat_template", None))
        if self._renders_tools:
            chat, tools = template_chat(messages)
        if getattr(self.tokenizer, "chat_template", None):
            from jinja2 import TemplateError

            try:
                text = self.tokenizer.apply_chat_template(chat, tools=tools, tokenize=False,
                                                          add_generation_prompt=True)
            except TemplateError as error:  # e.g. a template that demands alternating user/assistant roles
                raise ModelError(f"the model's chat template refuses this chat: {error}") from error
        else:  # plain masked LMs (BERT) ship no template
            text = "".join(f"{m['role']}: {m['content']}\n" for m in chat) + "assistant:"
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prepare(
        self, messages: Sequence[ChatMessage], cancel: threading.Event | None = None, conversation: str | None = None,
        system_prompt: str | None = None, words: str = "",
    ) -> list[int]:
        """Encode, while the model is idle, the part of the next prompt that does not depend on the user's next
        words: `messages` (what the next answer will see before them) and the user header. A voice session calls it
        when an answer ends, so the next turn's prefill, on its critical path, encodes only the new words (turn 2-10
        of a conversation re-encoded 57-87 tokens: the one-exchange history window slides every turn), into the
        cache slot kept for `conversation` (`GenerationOptions.conversation`), and again while the user speaks, with
        the `words` the recogniser has committed so far (the next message starts with them): the answer's first pass
        then encodes only the last words and the template's tail. `cancel` drops it if it is still waiting.
        `system_prompt` is the one the next answer will ask for (`GenerationOptions.system_prompt`). Returns the
        tokens queued (none when the back end keeps no cache between answers)."""
        self.vocabulary()  # scanned here, while idle, rather than on the next answer's critical path
        shared = self.next_prompt_prefix(messages, system_prompt, words)
        if not shared or not self.backend.prepare(shared, cancel, conversation):
            return []
        return shared

    def standing_aside(self, seconds: float) -> AbstractContextManager[None]:
        """While held (at most `seconds`), no pass of any answer starts (the one in flight finishes): for work of this
        process that someone waits on and the passes would slow: on two cores Piper took about twice as long for a
        voice answer's first phrase while the answer's next passes ran beside it (voice/speak/stage.py)."""
        return self.backend.standing_aside(seconds)

    def next_prompt_prefix(self, messages: Sequence[ChatMessage], system_prompt: str | None = None,
                           words: str = "") -> list[int]:
        """The tokens every prompt of `messages` plus one more user message starts with, whatever its words after
        `words` (the message's known start; a word after them begins with a space)."""
        words = words.strip()
        start = f"{words} " if words else ""
        one = self.prompt_ids([*messages, ChatMessage("user", f"{start}a")], system_prompt)
        other = self.prompt_ids([*messages, ChatMessage("user", f"{start}b")], system_prompt)
        return one[: common_prefix(one, other)]

    def check_context(self, prompt_tokens: int, max_new_tokens: int, limit: int | None = None) -> None:
        """Raise `ContextLengthExceeded` when the prompt and the answer do not fit the model's context, or `limit`
        (a server's own cap) when that is smaller. The answer counts as the sampler computes it: whole blocks."""
        budgets = [size for size in (self.context_length, limit) if size is not None]
        if not budgets:
            return
        context = min(budgets)
        block = self.sampler.block_length
        answer = whole_blocks(max_new_tokens, block)
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
        """`stream_chat` for a tokenized prompt. Refuses (`ModelError`) before the answer waits for the model."""
        plan = self.plan(list(prompt), options)
        self.check_context(len(plan.prompt), options.max_new_tokens)
        return self._drafts(plan, cancel)

    def plan(self, prompt: list[int], options: GenerationOptions, config: SamplerConfig | None = None) -> AnswerPlan:
        """One answer of `prompt` as a back end computes it: `options.max_new_tokens` in whole blocks, the caller's
        guard for this prompt, and the end-of-turn probe's row when the prompt ends with a user message. `config`:
        the model's decoding settings unless given."""
        options.check()
        config = config or self.sampler
        tail = self.message_tail()
        row = probe_row(prompt, tail, self.vocabulary().punctuation) if tail else None
        probe = EndOfTurnRow(row, self.message_end_ids()) if row is not None else None
        guard = self.speech_guard(options, prompt)
        return AnswerPlan(prompt, whole_blocks(options.max_new_tokens, config.block_length), config, options, guard,
                          probe, self.grammar(options, config))

    @property
    def constrains_answers(self) -> bool:
        """Whether this model enforces a response format or tool calls (`grammar`): its back end's passes follow the
        grammar, in every decoding mode (diffusion commits left to right under one: model/decoding/sampler.py)."""
        return self.backend.constrains

    def grammar(self, options: GenerationOptions, config: SamplerConfig) -> Grammar | None:
        """The parser state of the caller's `response_format` or tool calls (None for free text). Refused for a back
        end whose own sampler knows no grammar (DiffusionGemma)."""
        if options.response_format is None and options.tools is None:
            return None
        if not self.backend.constrains:
            what = "tool calls" if options.tools is not None else "a response_format"
            raise GrammarError(f"{self.name} decodes with its own sampler, which cannot be held to {what}")
        grammar = (compile_tools(dataclasses.replace(options.tools, forms=self.call_forms()))
                   if options.tools is not None else compile_format(options.response_format))
        with self._guards_lock:
            if self._grammar_tokenizer is None:
                self._grammar_tokenizer = grammar_tokenizer(self.tokenizer, {self.tokenizer.eos_token_id})
        return Grammar(self._grammar_tokenizer, grammar)

    def call_forms(self) -> tuple[CallForm, ...]:
        """The forms this model's tool calls may take (model/decoding/call_formats.py), by its tokenizer's special
        tokens: Llama 3.x's vocabulary adds `<|python_tag|>`."""
        decoder = getattr(self.tokenizer, "added_tokens_decoder", {})
        return forms_for(frozenset(token.content for token in decoder.values() if token.special))

    def _drafts(self, plan: AnswerPlan, cancel: threading.Event | None) -> Iterator[Draft]:
        options, prompt_tokens = plan.options, len(plan.prompt)
        cancelled = Draft(step=0, pieces=(), done=True, finish_reason="cancelled", prompt_tokens=prompt_tokens)
        passes = self.backend.answer(plan, cancel)
        texts = TokenTexts(self.tokenizer)
        try:
            for refinement in passes:
                draft = draft_from_refinement(texts, refinement, prompt_tokens, options.max_new_tokens)
                # read after the first pass: the prompt is encoded when the answer starts
                draft = dataclasses.replace(draft, cached_prompt_tokens=passes.reused_tokens)
                stopped = end_at_stop(draft, options.stop) if options.stop else None
                yield stopped or draft
                if stopped is not None or draft.done:
                    return
        except GenerationCancelled:  # cancelled while waiting for the model or during the prompt's prefill
            yield cancelled
        finally:
            passes.close()  # frees the model (lock or batch slot) at once

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

    def speech_guard(self, options: GenerationOptions, prompt: list[int] | None = None) -> SpeechGuard | None:
        """The anti-loop rules the caller asks for (`options.rules`), with this tokenizer's word classes and
        sentence-end tokens, for `prompt` (None when every rule is off). With tools offered, an answer that opens a
        tool call is exempt: the rules are for speech."""
        rules = options.rules
        calls = options.tools is not None
        key = (rules.no_repeat_ngram, rules.end_after, rules.no_copy_ngram, rules.no_copy_opening, calls)
        if not rules.active:
            return None
        with self._guards_lock:
            guard = self._guards.get(key)
            if guard is None:
                vocabulary = self.vocabulary()
                copying = rules.no_copy_ngram or rules.no_copy_opening
                guard = self._guards[key] = SpeechGuard(
                    no_repeat_ngram=rules.no_repeat_ngram,
                    end_after=rules.end_after,
                    sentence_end_ids=vocabulary.sentence_ends if rules.end_after else frozenset(),
                    eos_id=self.tokenizer.eos_token_id,
                    words=vocabulary.words if rules.no_repeat_ngram or copying else None,
                    no_copy_ngram=rules.no_copy_ngram,
                    no_copy_opening=rules.no_copy_opening,
                    call_openers=vocabulary.call_openers if calls else frozenset(),
                )
        return guard if prompt is None else guard.for_prompt(prompt)
