"""The phrase speculator: which phrases of a diffusion LM's answer to render early, and when each becomes final.

A diffusion LM's early refinement passes already hold a draft of the whole next phrase. The speculator cuts the draft
(committed prefix + current guess) into phrases at natural boundaries and asks for a speculative render of a phrase once
its draft text has been the same for `stable_passes` drafts and its least confident token is above `min_confidence`.
When a phrase is final (its text and the whitespace after it are committed, or the answer is done) it says `Commit`;
the speaking stage then releases the matching render at once (a hit) or renders the committed text (a miss). A render
whose phrase later changes gets a `Discard`. Audio is only ever released on `Commit`, whose text is always committed
text, so a wrong draft costs CPU, never a wrong word.

Phrase ids are stable: phrase i is always the i-th phrase of the committed answer. That holds because every boundary
decision looks only at the text before it (the word that just ended and the phrase so far), so the phrases of a
prefix are the leading phrases of any longer text.

No I/O: feed it `Draft`s, read the actions back. Like whisper_streaming's processors, a simulator or the async stage can
drive it alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from model.chat import Draft
from voice.listen.words import ends_leaning

_SENTENCE_END = ".!?…"
_CLAUSE_END = ",;:—–"
_DASHES = ("-", "--", "–", "—")
_CLOSERS = "\"')]}*_`’”»"
_OPENERS = "\"'([{*_`‘“«"
# Words ending in "." that rarely end a sentence; cutting after them would split "Dr. Smith" or "e.g. this".
_ABBREVIATIONS = frozenset(
    (
        "dr.", "mr.", "mrs.", "ms.", "prof.", "st.", "jr.", "sr.", "vs.", "etc.", "e.g.", "i.e.", "approx.", "no.",
        "fig.", "inc.", "ltd.", "co.", "mt.", "dept.", "est.", "a.m.", "p.m.", "jan.", "feb.", "mar.", "apr.", "jun.",
        "jul.", "aug.", "sep.", "sept.", "oct.", "nov.", "dec.", "u.s.", "u.k.",
    )
)
_INITIALS = re.compile(r"(?:[A-Za-z]\.){2,}|[B-HJ-Z]\.")
_LIST_MARKER = re.compile(r"\d+[.)]")


@dataclass(frozen=True, slots=True)
class SpeculatorConfig:
    """Thresholds of the speculator. `enabled=False` turns speculation off: only `Commit` actions, so phrases are
    rendered on commit (the baseline speculation is measured against).

    Defaults chosen from `scripts/bench/bench_tts.py`'s replay of the bundled model's drafts over 50 held-out prompts:
    with 4-token blocks a phrase's end is visible only about one pass before it commits, so waiting for k=2 stable
    drafts hit 7 % of phrases; k=1 with min_confidence 0.5 hits 33 % at 0.44 wasted renders per answer (k=1 with no
    confidence floor hits 45 % but wastes 1.3 renders per answer, CPU the language model needs on 2 cores). The first
    phrase, whose audio the user waits for, has no floor and closes after 3 words (was 5): in the latency report's 18
    turns voice-to-voice p50 went 967 -> 798 ms with 3 words and -> 678 ms without the floor (TTS after the first
    commit p50 124 -> 98 -> 5 ms).
    """

    enabled: bool = True
    stable_passes: int = 1  # k: consecutive drafts with the same phrase text before a render (see the class docstring)
    min_confidence: float = 0.5  # every uncommitted token of the phrase at least this probable
    first_min_confidence: float = 0.0  # ... of the first phrase: its audio is the one the user waits for
    # cut the first phrase after this many words if no punctuation came (0: never), at a word that does not lean on
    # the next ("The capital of France | is Paris.")
    first_phrase_words: int = 3
    min_clause_words: int = 3  # a comma/colon/dash cuts only a phrase of at least this many words
    max_ahead: int = 2  # render at most this many uncommitted phrases ahead of the next one to commit

    def __post_init__(self) -> None:
        if self.stable_passes < 1:
            raise ValueError("stable_passes must be at least 1")
        if not (0.0 <= self.min_confidence <= 1.0 and 0.0 <= self.first_min_confidence <= 1.0):
            raise ValueError("min_confidence and first_min_confidence must be in [0, 1]")
        if self.first_phrase_words < 0 or self.min_clause_words < 1 or self.max_ahead < 1:
            raise ValueError("first_phrase_words must be >= 0, min_clause_words and max_ahead >= 1")


@dataclass(frozen=True, slots=True)
class Render:
    """Render this draft of phrase `phrase_id` speculatively; it may still change."""

    phrase_id: int
    text: str


@dataclass(frozen=True, slots=True)
class Commit:
    """Phrase `phrase_id` is final with this text: its audio may be played."""

    phrase_id: int
    text: str


@dataclass(frozen=True, slots=True)
class Discard:
    """The draft of a phrase that was rendered changed (or vanished): drop that render."""

    phrase_id: int


Action = Render | Commit | Discard


@dataclass(frozen=True, slots=True)
class PhraseSpan:
    """A closed phrase of a text: `text` is `source[start:end]` stripped; `end` is where its boundary whitespace
    starts (or the end of the text for a final tail)."""

    start: int
    end: int
    text: str


def _is_abbreviation(core: str) -> bool:
    bare = core.lstrip(_OPENERS)
    return bare.lower() in _ABBREVIATIONS or _INITIALS.fullmatch(bare) is not None


def _ends_phrase(word: str, words: int, first: bool, config: SpeculatorConfig) -> bool:
    """Whether a phrase that has `words` words, the last being `word`, ends here. Looks only backwards."""
    core = word.rstrip(_CLOSERS)
    if core.endswith(tuple(_SENTENCE_END)):
        if core.endswith(".") and _is_abbreviation(core):
            return False
        return not (words == 1 and _LIST_MARKER.fullmatch(core))
    if (core.endswith(tuple(_CLAUSE_END)) or core in _DASHES) and words >= config.min_clause_words:
        return True
    if first and config.first_phrase_words and words >= config.first_phrase_words:
        # Keep "3 million", "$5 billion", "Dr. Smith" and "the capital of France" in one piece.
        return not (core[-1:].isdigit() or _is_abbreviation(core) or ends_leaning(core))
    return False


def split_phrases(text: str, config: SpeculatorConfig, *, final: bool) -> tuple[list[PhraseSpan], int]:
    """Cut `text` into closed phrases; return them and where the open tail starts.

    A phrase closes at the whitespace after a word that ends a sentence (not an abbreviation, initial or list marker),
    at a line break, at clause punctuation once it has `min_clause_words` words, or, for the first phrase only, after
    `first_phrase_words` words. The boundary needs the whitespace itself, so "3." is no boundary until the next
    character shows it is not "3.5". With `final`, a non-blank tail is a phrase too.
    """
    phrases: list[PhraseSpan] = []
    start = 0
    word_start = 0
    words = 0
    for index, char in enumerate(text):
        if not char.isspace():
            if index == 0 or text[index - 1].isspace():
                word_start = index
            continue
        if index == 0 or text[index - 1].isspace():
            continue
        words += 1
        if char == "\n" or _ends_phrase(text[word_start:index], words, not phrases, config):
            phrases.append(PhraseSpan(start, index, text[start:index].strip()))
            start = index
            words = 0
    if final and text[start:].strip():
        phrases.append(PhraseSpan(start, len(text), text[start:].strip()))
        start = len(text)
    return phrases, start


def _min_confidence(draft: Draft, lo: int, hi: int) -> float:
    """Least confidence of the uncommitted pieces overlapping characters [lo, hi) of the draft text."""
    lowest = 1.0
    offset = 0
    for piece in draft.pieces:
        end = offset + len(piece.text)
        if end > lo and offset < hi and not piece.committed:
            lowest = min(lowest, piece.confidence)
        if offset >= hi:
            break
        offset = end
    return lowest


def _guesses_end(draft: Draft) -> bool:
    """Whether the model currently guesses that the answer ends where the draft text ends (an end-of-sequence guess
    in its tokens). Only local models tell us; the guess makes the last phrase renderable before the answer is done."""
    refinement = draft.refinement
    return refinement is not None and any(token in refinement.eos_ids for token in refinement.tokens)


@dataclass(slots=True)
class _Candidate:
    text: str
    stable: int
    rendered: bool = False


class PhraseSpeculator:
    """Feed the drafts of one answer with `feed`; call `finish` if the stream ends without a done draft."""

    def __init__(self, config: SpeculatorConfig = SpeculatorConfig()) -> None:
        self.config = config
        self._committed: list[str] = []
        self._committed_text = ""
        self._candidates: dict[int, _Candidate] = {}
        self._finished = False

    @property
    def committed_phrases(self) -> tuple[str, ...]:
        """The texts of the phrases committed so far, in order (phrase id = index)."""
        return tuple(self._committed)

    @property
    def finished(self) -> bool:
        return self._finished

    def feed(self, draft: Draft) -> list[Action]:
        """The actions one refinement pass calls for, in order: for each phrase its `Discard` before its `Commit` or
        new `Render`. A done draft finishes the answer (see `finish`)."""
        if self._finished:
            raise ValueError("this answer is finished; use a new PhraseSpeculator for the next answer")
        text = draft.text
        self._committed_text = draft.committed_text
        if draft.done:
            return self.finish(final=draft.finish_reason != "cancelled")
        spans, tail_start = split_phrases(text, self.config, final=False)
        speculative_end = len(spans)
        if _guesses_end(draft) and text[tail_start:].strip():
            spans.append(PhraseSpan(tail_start, len(text), text[tail_start:].strip()))
        actions: list[Action] = []
        committed_len = len(self._committed_text)
        while len(self._committed) < speculative_end and spans[len(self._committed)].end < committed_len:
            self._commit(len(self._committed), spans[len(self._committed)].text, actions)
        if self.config.enabled:
            self._speculate(draft, spans, actions)
        return actions

    def finish(self, final: bool = True) -> list[Action]:
        """End the answer: commit every remaining phrase of the committed text (with `final`, its tail too; without,
        as after a cancel, only closed phrases) and discard renders of phrases that will never be committed."""
        if self._finished:
            return []
        self._finished = True
        spans, _ = split_phrases(self._committed_text, self.config, final=final)
        actions: list[Action] = []
        for phrase_id in range(len(self._committed), len(spans)):
            self._commit(phrase_id, spans[phrase_id].text, actions)
        actions.extend(Discard(pid) for pid, candidate in sorted(self._candidates.items()) if candidate.rendered)
        self._candidates.clear()
        return actions

    def _commit(self, phrase_id: int, text: str, actions: list[Action]) -> None:
        candidate = self._candidates.pop(phrase_id, None)
        if candidate is not None and candidate.rendered and candidate.text != text:
            actions.append(Discard(phrase_id))
        actions.append(Commit(phrase_id, text))
        self._committed.append(text)

    def _speculate(self, draft: Draft, spans: list[PhraseSpan], actions: list[Action]) -> None:
        first_open = len(self._committed)
        text_len = len(draft.text)

        def floor(phrase_id: int) -> float:
            return self.config.first_min_confidence if phrase_id == 0 else self.config.min_confidence

        for phrase_id in range(first_open, len(spans)):
            span = spans[phrase_id]
            candidate = self._candidates.get(phrase_id)
            if candidate is not None and candidate.text == span.text:
                candidate.stable += 1
            else:
                if candidate is not None and candidate.rendered:
                    actions.append(Discard(phrase_id))
                candidate = _Candidate(span.text, stable=1)
                self._candidates[phrase_id] = candidate
            if (
                not candidate.rendered
                and phrase_id < first_open + self.config.max_ahead
                and candidate.stable >= self.config.stable_passes
                and _min_confidence(draft, span.start, min(span.end + 1, text_len)) >= floor(phrase_id)
            ):
                candidate.rendered = True
                actions.append(Render(phrase_id, span.text))
        for phrase_id in [pid for pid in self._candidates if pid >= len(spans)]:
            if self._candidates.pop(phrase_id).rendered:
                actions.append(Discard(phrase_id))
