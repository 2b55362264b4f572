"""The text layer of a local model: token ids to text pieces and drafts, and the vocabulary scans the guards and the
end-of-turn probe read. No network and no decoding here: what a pass produced, shown as text."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from model.chat import Draft, DraftPiece
from model.decoding.call_formats import OPENING_CHARACTERS
from model.decoding.refinement import Refinement
from model.decoding.speech_guard import WordClasses

# Tokens decoded again on each side of a piece: enough for byte-level BPE and SentencePiece to merge a multi-byte
# character or restore a leading space the same way they would in the whole text.
DECODE_CONTEXT = 4


class TokenTexts:
    """Text of each token of an answer, decoded incrementally so characters spanning several tokens come out whole.

    A token whose text ends inside an unfinished UTF-8 character gets "" and the character goes to the token that
    completes it (the streaming-detokenizer trick: decode a short window and take what it adds). The last token is
    held back the same way unless `final` (the answer ends there): its completing token may simply not be drafted yet
    (a block end, a `max_tokens` cut, an end-of-sequence guess), and text once shown must not turn from "\ufffd" into
    a character later. A token's text depends only on the tokens up to it, so committed text never changes, and one
    object per answer decodes only what changed since its last call: a pass moves an answer a few tokens on, and
    decoding its whole answer again every pass cost 4 concurrent answers a fifth of their wall time.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._tokens: list[int] = []
        self._texts: list[str] = []
        self._emitted: list[int] = []  # after each token: the first token whose text had not been emitted yet

    def __call__(self, tokens: Sequence[int], final: bool = False) -> list[str]:
        tokens = list(tokens)
        # reuse what the tokens share with the last call's, but for its last token (decoded as the last one then)
        keep = max(0, min(common_prefix_length(self._tokens, tokens), len(self._tokens) - 1))
        texts, emitted_after = self._texts[:keep], self._emitted[:keep]
        emitted = emitted_after[-1] if emitted_after else 0
        for index in range(keep, len(tokens)):
            left = max(0, emitted - DECODE_CONTEXT)
            before = self.tokenizer.decode(tokens[left:emitted])
            after = self.tokenizer.decode(tokens[left : index + 1])
            if after.endswith("\ufffd") and (index + 1 < len(tokens) or not final):
                texts.append("")
            else:
                texts.append(after[len(before) :] if after.startswith(before) else after)
                emitted = index + 1
            emitted_after.append(emitted)
        self._tokens, self._texts, self._emitted = tokens, texts, emitted_after
        return list(texts)


def token_texts(tokenizer: Any, tokens: Sequence[int], final: bool = False) -> list[str]:
    """`TokenTexts` for one call: each token's text (see there)."""
    return TokenTexts(tokenizer)(tokens, final)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


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
    call_openers: frozenset[int]  # tokens whose text may open a tool call (model/decoding/call_formats.py)

    @classmethod
    def scan(cls, tokenizer: Any) -> Vocabulary:
        texts = token_texts_of_vocabulary(tokenizer)
        ends, punctuation = sentence_end_ids(tokenizer, texts), punctuation_ids(texts)
        openers = frozenset(i for i, text in enumerate(texts) if text.lstrip().startswith(OPENING_CHARACTERS))
        return cls(ends, punctuation, ends & punctuation, WordClasses.from_texts(texts), openers)


def draft_from_refinement(
    tokenizer: Any | TokenTexts, refinement: Refinement, prompt_tokens: int, limit: int | None = None
) -> Draft:
    """Pieces up to the first end-of-sequence guess (and at most `limit` tokens); a piece is committed when every
    token it holds is. `tokenizer`: the answer's `TokenTexts` (or a tokenizer, decoding the answer whole).

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
    texts = tokenizer if isinstance(tokenizer, TokenTexts) else TokenTexts(tokenizer)
    for index, text in enumerate(texts(tokens, final=ends_here)):
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
