"""The speech guard: rules that keep a spoken answer from looping, as edits of the teacher's logits.

No repeated word n-grams, no copied runs of the prompt, no opening as an earlier answer opened, an end at a sentence
end once the answer is long enough. Each is a pure function of the prompt and the answer so far, so every decoding
mode applies the same rules to the same prefix: the self-speculative mode to each verification row (`guarded`), the
diffusion sampler to each masked position given the tokens left of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass(frozen=True, slots=True)
class WordClasses:
    """Token ids grouped by the word they spell, so the guard sees "A quick" and " a quick" as the same words.

    `of[t]` is token t's class, or -1 for a token that spells no word (punctuation, spaces): the guard skips those
    when it compares words alone and keys them by their own id otherwise. `members[c]` are the tokens of class c,
    banned together.
    """

    of: tuple[int, ...]
    members: dict[int, tuple[int, ...]]

    @classmethod
    def from_texts(cls, texts: list[str]) -> WordClasses:
        """Classes from each token's decoded text: lower-cased, spaces and punctuation removed (apostrophes kept)."""
        index: dict[str, int] = {}
        of: list[int] = []
        members: dict[int, list[int]] = {}
        for token_id, text in enumerate(texts):
            key = "".join(ch for ch in text.lower().replace("\u2019", "'") if ch.isalnum() or ch == "'")
            if not key:
                of.append(-1)
                continue
            cls_id = index.setdefault(key, len(index))
            of.append(cls_id)
            members.setdefault(cls_id, []).append(token_id)
        return cls(tuple(of), {c: tuple(ids) for c, ids in members.items()})


@dataclass(frozen=True, slots=True)
class SpeechGuard:
    """Rules that keep spoken answers from looping; applied to the teacher's logits identically in every mode.

    With `words`, n-grams are compared as a listener hears them, case and leading spaces ignored, twice: with
    punctuation (no 'A: "A: "') and without it (no "a quick breakfast. A quick breakfast"). The token-id rule let
    "A quick breakfast is a quick breakfast." through, since "A" and " a" are different tokens.

    `no_copy_ngram` keeps the answer from copying runs of its prompt (punctuation counted): in a long conversation a
    small model otherwise repeats its previous answer for an unclear question, and the copy then feeds the next turn
    ("A: "A: "" five turns in a row in a 60-turn soak). `no_copy_opening` keeps it from opening the way an earlier
    answer opened: the copy rule stopped the verbatim copies, but five answers in a row still began "A: ...".
    `for_prompt` gives the guard of one request.
    """

    no_repeat_ngram: int = 0  # n > 0: never emit a token that would repeat an n-gram of the answer
    end_after: int = 0  # > 0: once the answer holds this many tokens, end it after the next sentence end
    sentence_end_ids: frozenset[int] = frozenset()  # tokens that end a sentence (".", "!", "?" ...)
    eos_id: int | None = None
    words: WordClasses | None = None  # None: compare token ids as they are
    no_copy_ngram: int = 0  # n > 0: never emit a token that would copy an n-gram of the prompt
    copied: dict[tuple[int, ...], frozenset[int]] = field(default_factory=dict)  # prompt (n-1)-gram -> next keys
    no_copy_opening: int = 0  # n > 0: never open with the first n tokens an earlier answer in the prompt opened with
    openings: frozenset[tuple[int, ...]] = frozenset()  # those openings (keys), found by `for_prompt`
    # Tokens that may open a tool call (their text starts as a call's form does: "<", "{", "`";
    # model/decoding/call_formats.py). An answer opening with one is taken for a call, not speech: no rule applies to
    # it, since its name and arguments must copy the offer and the user's words (`{"name":"get_time"`,
    # `{"text":"hello there"}`).
    call_openers: frozenset[int] = frozenset()

    def for_prompt(self, prompt: list[int], header: int = 3) -> SpeechGuard:
        """This guard with the prompt's n-grams and earlier answers' openings indexed (itself when both are off).

        Earlier answers are found by the prompt's own last `header` tokens: a chat prompt ends with the assistant
        header ("<|im_start|>assistant\\n"), and the template wrote the same tokens before each earlier answer.
        """
        n, k = self.no_copy_ngram, self.no_copy_opening
        if n <= 0 and k <= 0:
            return self
        keys = [self._key(t) for t in prompt]
        index: dict[tuple[int, ...], set[int]] = {}
        for i in range(len(keys) - n + 1 if n > 0 else 0):
            index.setdefault(tuple(keys[i : i + n - 1]), set()).add(keys[i + n - 1])
        mark = prompt[-header:] if k > 0 and len(prompt) > header else None
        starts = [i + header for i in range(len(prompt) - header) if mark and prompt[i : i + header] == mark]
        openings = frozenset(tuple(keys[i : i + k]) for i in starts if i + k <= len(prompt) - header)
        return replace(self, copied={c: frozenset(after) for c, after in index.items()}, openings=openings)

    def _key(self, token: int) -> int:
        """A token as heard: its word class, or for punctuation its own identity (as -2 - id)."""
        if self.words is None:
            return token
        word = self.words.of[token]
        return word if word >= 0 else -2 - token

    def _tokens_of(self, key: int) -> tuple[int, ...]:
        if self.words is None:
            return (key,)
        return (-2 - key,) if key < 0 else self.words.members[key]

    def apply(self, logits: torch.Tensor, answer: list[int]) -> None:
        """Edit `logits` ([V], in place) for the token that follows `answer`."""
        if answer and answer[0] in self.call_openers:
            return
        banned: set[int] = set()
        n = self.no_repeat_ngram
        if n > 0:
            # tokens as said (punctuation counted: 'A: "A: "') and the words alone ("breakfast. A quick breakfast")
            spoken = [self._key(t) for t in answer]
            for keys in (spoken, [key for key in spoken if key >= 0]) if self.words is not None else (answer,):
                if len(keys) >= n:
                    context = keys[len(keys) - n + 1 :]
                    repeats = {keys[i + n - 1] for i in range(len(keys) - n + 1) if keys[i : i + n - 1] == context}
                    banned.update(token for key in repeats for token in self._tokens_of(key))
        n = self.no_copy_ngram
        if n > 0 and self.copied and len(answer) >= n - 1:
            context = tuple(self._key(t) for t in answer[len(answer) - n + 1 :])
            banned.update(token for key in self.copied.get(context, ()) for token in self._tokens_of(key))
        k = len(answer) + 1
        if k == self.no_copy_opening and self.openings:
            opened = tuple(self._key(t) for t in answer)
            after = {opening[-1] for opening in self.openings if opening[:-1] == opened}
            banned.update(token for key in after for token in self._tokens_of(key))
        if banned:
            logits[sorted(banned)] = -torch.inf
        long_enough = self.end_after and self.eos_id is not None and len(answer) >= self.end_after
        if long_enough and answer[-1] in self.sentence_end_ids:
            logits.fill_(-torch.inf)
            logits[self.eos_id] = 0.0


def guarded(
    logits: torch.Tensor, answer: list[int], drafts: list[int], guard: SpeechGuard | None, copy: bool = False
) -> torch.Tensor:
    """The guard applied to each verification row with its own prefix: row i follows `answer + drafts[:i]`.

    logits: [k + 1, V] -> [k + 1, V] float32: a copy when there is a guard or the caller asks for one (`copy`: it
    will edit them), else the rows themselves (a copy of a 49K vocabulary's row costs ~35 µs a decoding step).
    """
    if guard is None and not copy:
        return logits.float()
    logits = logits.float().clone()
    if guard is not None:
        for i in range(logits.shape[0]):
            guard.apply(logits[i], answer + drafts[:i])
    return logits
