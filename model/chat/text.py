"""The text layer of a local model: token ids to text pieces and drafts, and the vocabulary scans the guards and the
end-of-turn probe read. No network and no decoding here: what a pass produced, shown as text."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from model.chat import Draft, DraftPiece
from model.decoding.refinement import Refinement
from model.decoding.speech_guard import WordClasses

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
    call_openers: frozenset[int]  # tokens whose text starts with "<": the first token of a tool call

    @classmethod
    def scan(cls, tokenizer: Any) -> Vocabulary:
        texts = token_texts_of_vocabulary(tokenizer)
        ends, punctuation = sentence_end_ids(tokenizer, texts), punctuation_ids(texts)
        openers = frozenset(i for i, text in enumerate(texts) if text.lstrip().startswith("<"))
        return cls(ends, punctuation, ends & punctuation, WordClasses.from_texts(texts), openers)


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
