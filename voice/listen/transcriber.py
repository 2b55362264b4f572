"""Streaming transcription over faster-whisper, in the shape insert_audio / process / finish. No I/O, no threads.

Whisper is not a streaming model, so this re-decodes a growing buffer of the current turn's audio each time enough new
audio has arrived (`partial_step_s`), and commits the words two consecutive decodes agree on (LocalAgreement-2, see
`voice.listen.local_agreement`). Long turns stay cheap: once the buffer passes `trim_after_s`, it is cut at the end of
the last fully committed Whisper segment, and the committed text before the cut becomes the initial prompt so the model
keeps its context. `finish` reuses the last decode when no audio arrived since; otherwise it decodes exactly once more.

The caller owns threading: `process` and `finish` block for one decode (~0.3 s for tiny.en on two busy cores), so the
async stage runs them in a worker thread while holding the shared model's lock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from voice.audio import TARGET_RATE, check_float32_mono, load_audio_16k
from voice.errors import ASRError
from voice.listen.local_agreement import LocalAgreement, Word, join_words

# Below a few seconds of encoder window, tiny.en starts to hallucinate; above, the encoder cost grows ~linearly.
MIN_ENCODER_WINDOW_S = 5.0
MAX_TOKENS_PER_S = 8
MAX_NEW_TOKENS = 200  # with the prompt, within Whisper's 448-token decoder limit
WHISPER_WINDOW_S = 30
_HAS_WORD = re.compile(r"\w")
_PIECES = re.compile(r"\s*\S+")


@runtime_checkable
class WindowedEncoder(Protocol):
    """A Whisper model whose encoder can be shown less than the 30 s window (voice/listen/asr_models.py's
    `windowed_model_class`): `encoder_frames` mel frames, or all of them when None."""

    encoder_frames: int | None


@dataclass(frozen=True, slots=True)
class TranscriberConfig:
    """Decoding is greedy at temperature 0 by default: on a laptop CPU a beam or a temperature fallback costs more
    latency than it buys in accuracy on short turns. `transcribe_file` uses the same options, so offline and
    streaming results are comparable."""

    language: str | None = "en"
    beam_size: int = 1
    partial_step_s: float = 0.25
    # Encoder window beyond the audio for partials / finals (None: Whisper's full 30 s, as offline decoding does).
    # The final decode is what the answer waits for; its cost grows with the window (tiny.en, one thread, a 1-2 s
    # turn: 10 s window ~140 ms, 6-7 s ~105 ms). `python scripts/bench/bench_asr.py --window-sweep 8,6,5,4` (144
    # segments of tuning recordings, each cut eight ways): audio + 8 s 13.8 % WER at 140 ms a decode, + 6 s 11.6 %
    # at 112, + 5 s 11.6 % at 103, + 4 s 13.0 % at 90. The full 30 s window costs ~4x the 10 s one.
    partial_margin_s: float | None = 2.0
    final_margin_s: float | None = 5.0
    # A final that repeats itself ("F F F", "minute, minute, minute") or hears nothing where a partial heard words is
    # decoded again on each of these windows in turn (None: Whisper's full 30 s one, as offline decoding), while it
    # stays so; the last decode's words are kept. On short windows tiny.en loops more (a one-word card at + 4 s;
    # held-out prompts at + 5 s, where + 8 s heard "Folder 9."), and faster-whisper's no-speech rule drops more words:
    # "In valid choice." at + 5 s (no-speech probability 0.64, mean log-probability -1.24, past its 0.6 and -1.0) and
    # "extension." at + 5 s and + 8 s, each a held-out turn left unanswered (about 1 in 30); the full window heard
    # both. Rechecking loops on the full window at once (~4x a decode) held 16 of 60 held-out turns past 1 s.
    recheck_margins_s: tuple[float | None, ...] = (8.0, None)
    trim_after_s: float = 10.0
    force_trim_after_s: float = 20.0
    max_prompt_chars: int = 200

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError("beam_size must be >= 1")
        if self.partial_step_s <= 0:
            raise ValueError("partial_step_s must be > 0")
        if not 0 < self.trim_after_s <= self.force_trim_after_s < 30:
            raise ValueError("need 0 < trim_after_s <= force_trim_after_s < 30 (Whisper's window)")


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """What the transcriber believes the user said so far. `committed` never changes once shown; `text` is
    `committed` plus the current tentative tail. `audio_s` is how much of the turn the decode covered."""

    committed: str
    text: str
    final: bool
    audio_s: float


def decode_options(config: TranscriberConfig) -> dict[str, Any]:
    """Keyword arguments for `WhisperModel.transcribe` shared by streaming and offline decoding."""
    return {
        "language": config.language,
        "beam_size": config.beam_size,
        "temperature": 0.0,
        "condition_on_previous_text": False,
        "vad_filter": False,
    }


def decode_words(model: Any, audio: np.ndarray, config: TranscriberConfig, offset_s: float = 0.0,
                 prompt: str | None = None, window_margin_s: float | None = None,
                 word_times: bool = True) -> tuple[list[Word], list[float]]:
    """Decode `audio` once; return its words and segment end times, shifted by `offset_s` into turn time.

    `window_margin_s` shows the encoder only the audio plus that margin instead of Whisper's 30 s window (see
    `voice.listen.asr_models.windowed_model_class`); ignored by a model without `encoder_frames`. Without
    `word_times` the words are the same (alignment runs after decoding) but their times are spread evenly over their
    segment: faster-whisper's word alignment is a quarter of a decode, and a turn's final text does not need it.
    """
    windowed = window_margin_s is not None and isinstance(model, WindowedEncoder)
    options = decode_options(config)
    if windowed:
        window_s = max(audio.size / TARGET_RATE + window_margin_s, MIN_ENCODER_WINDOW_S)
        # whole seconds (100 mel frames each): a new input length costs CTranslate2 memory it keeps, so the
        # windows come in at most 30 sizes
        model.encoder_frames = math.ceil(window_s) * 100
    if audio.size <= WHISPER_WINDOW_S * TARGET_RATE:
        # Tiny models can loop ("he was he was ...", ". . . ."), most of all on short windows and near-silent
        # buffers; cap the tokens at a fast speaker's rate so a loop costs little and ends.
        options["max_new_tokens"] = min(int(MAX_TOKENS_PER_S * audio.size / TARGET_RATE) + 8, MAX_NEW_TOKENS)
    try:
        segments, _info = model.transcribe(audio, word_timestamps=word_times, initial_prompt=prompt or None, **options)
        words: list[Word] = []
        segment_ends: list[float] = []
        for segment in segments:
            timed = segment.words if word_times else spread_words(segment.text, segment.start, segment.end)
            # punctuation-only "words" carry no speech (and are what a model hallucinates on silence)
            words.extend(Word(w.word, offset_s + w.start, offset_s + w.end) for w in timed or ()
                         if _HAS_WORD.search(w.word))
            segment_ends.append(offset_s + segment.end)
    except (RuntimeError, ValueError) as err:
        raise ASRError(f"Whisper decode failed on {audio.size / TARGET_RATE:.2f} s of audio: {err}") from err
    finally:
        if windowed:
            model.encoder_frames = None
    return drop_repeated_sentence(words), segment_ends


def _wider(window_margin_s: float | None, than_s: float | None) -> bool:
    """Whether a window of audio + `window_margin_s` (None: the full window) is wider than one of + `than_s`."""
    return than_s is not None and (window_margin_s is None or window_margin_s > than_s)


def _said_over(keys: list[str], period: int) -> bool:
    """Whether `keys` are their first `period` said again and again to the end, the last one possibly cut short (the
    token cap stopped the decode inside it)."""
    last = len(keys) - 1
    looped = all(keys[i] == keys[i % period] for i in range(period, last))
    return looped and bool(keys[last]) and keys[last % period].startswith(keys[last])


def repeat_themselves(words: list[Word]) -> bool:
    """Whether a decode looks like a loop: one word or phrase said over and over ("F F F", "Press 1-4 Press 1-4
    Press 1": the whole decode, at least twice), or one word three times in a row inside it."""
    keys = [word.key for word in words]
    if any(_said_over(keys, period) for period in range(1, len(keys) // 2 + 1)):
        return True
    return any(keys[i] == keys[i + 1] == keys[i + 2] for i in range(len(keys) - 2))


def drop_repeated_sentence(words: list[Word]) -> list[Word]:
    """One sentence said once, when a decode is nothing but that sentence two or more times over ("10 of clubs. 10 of
    clubs."), the last time possibly cut short by the token cap ("8 of spades 4 of close 7 of hearts. 8 of spades 4
    of close"): tiny.en writes such repeats on a short utterance followed by its window's silence (3 of the 5 card
    commands in a conversation, depending on where the segment's end fell), and no one asks an assistant the same
    sentence twice in one breath. A repeated word without a sentence end between ("5, 5") is kept."""
    keys = [word.key for word in words]
    for period in range(1, len(keys)):
        if words[period - 1].text.rstrip().endswith((".", "?", "!")) and _said_over(keys, period):
            return words[:period]
    return words


@dataclass(frozen=True, slots=True)
class _TimedWord:
    word: str
    start: float
    end: float


def spread_words(text: str, start: float, end: float) -> list[_TimedWord]:
    """A segment's words (each with its leading space, as Whisper's word timestamps give them), timed evenly."""
    pieces = _PIECES.findall(text)
    step = (end - start) / max(1, len(pieces))
    return [_TimedWord(piece, start + i * step, start + (i + 1) * step) for i, piece in enumerate(pieces)]


def whole_word_boundaries(committed: list[Word], tentative: list[Word]) -> list[float]:
    """End times of committed words after which a new word begins (Whisper marks one with a leading space)."""
    following = [*committed[1:], *tentative[:1]]
    boundaries = [word.end for word, after in zip(committed, following, strict=False) if after.text[:1].isspace()]
    if not tentative:
        boundaries.append(committed[-1].end)
    return boundaries


class StreamingTranscriber:
    """One user turn at a time: `insert_audio` as audio arrives, `process` for partials, `finish` for the final.
    `reset` starts the next turn."""

    def __init__(self, model: Any, config: TranscriberConfig | None = None) -> None:
        self.model = model
        self.config = config or TranscriberConfig()
        self.reset()

    def reset(self) -> None:
        self._agreement = LocalAgreement()
        self._chunks: list[np.ndarray] = []
        self._buffer = np.zeros(0, dtype=np.float32)
        self._buffer_start = 0  # turn sample index of the buffer's first sample
        self._total = 0  # samples inserted this turn
        self._decoded_to = 0  # turn sample index the last decode reached
        self._segment_ends: list[float] = []
        self._last_words: list[Word] = []
        self._last_margin_s: float | None = None
        self._last_decode_start_s = 0.0
        self._heard_words = False  # some decode of this turn heard words
        self.decodes = 0

    @property
    def audio_s(self) -> float:
        return self._total / TARGET_RATE

    @property
    def buffer_s(self) -> float:
        return (self._total - self._buffer_start) / TARGET_RATE

    def insert_audio(self, chunk: np.ndarray) -> None:
        """Append mono float32 16 kHz samples of the current turn."""
        chunk = check_float32_mono(chunk)
        if chunk.size:
            self._chunks.append(chunk)
            self._total += chunk.size

    def process(self, force: bool = False, as_final: bool = False) -> Hypothesis | None:
        """Decode if `partial_step_s` of new audio arrived (or any, with `force`); return the new partial or None.

        `as_final` decodes the way `finish` would (its encoder window, no word times), so that a `finish` with no
        audio in between returns this decode instead of repeating it: call it when the speaker has probably stopped.
        Its words, timed only roughly, do not go into LocalAgreement; if the speaker goes on, the next partial picks up
        from the one before.
        """
        new_samples = self._total - self._decoded_to
        if new_samples <= 0 or (not force and new_samples < self.config.partial_step_s * TARGET_RATE):
            return None
        if as_final:
            words = self._decode(self.config.final_margin_s, word_times=False, final=True)
            committed = join_words(self._agreement.committed)
            return Hypothesis(committed, join_words([*self._words_before_buffer(), *words]), False,
                              self._decoded_to / TARGET_RATE)
        words = self._decode(self.config.partial_margin_s)
        self._agreement.update(words)
        self._trim()
        return self._hypothesis(final=False)

    def finish(self) -> Hypothesis:
        """Final transcript of the turn. Decodes only if audio arrived since the last decode.

        The final is the committed words before the buffer plus the last decode of the whole buffer, which replaces
        the words LocalAgreement committed inside it: early commits can be wrong (two short hypotheses may agree on a
        mishearing), and the last decode has heard the whole utterance. A turn shorter than `trim_after_s` thus gets
        the same transcript as decoding the clip offline.
        """
        if self._total == 0:
            return Hypothesis("", "", True, 0.0)
        if self._total > self._decoded_to or self._last_margin_s != self.config.final_margin_s or not self.decodes:
            words = self._decode(self.config.final_margin_s, word_times=False, final=True)
        else:
            words = self._last_words
        before = self._words_before_buffer()
        self._agreement.reset()
        self._agreement.committed = [*before, *words]
        text = join_words(self._agreement.committed)
        return Hypothesis(text, text, True, self._decoded_to / TARGET_RATE)

    def _words_before_buffer(self) -> list[Word]:
        """Committed words before the last decode's buffer. The buffer may have been trimmed after that decode: split
        where its buffer began (a buffer never trimmed began at 0, and the decode heard every word: keeping one would
        say it twice)."""
        start = self._last_decode_start_s
        return [word for word in self._agreement.committed if word.end <= start + 0.05] if start > 0 else []

    def _decode(self, margin_s: float | None, word_times: bool = True, final: bool = False) -> list[Word]:
        """One decode of the buffer; a `final` one (the likely final's, the segment's) is rechecked when it loops or
        hears nothing (`TranscriberConfig.recheck_margins_s`)."""
        if self._chunks:
            self._buffer = np.concatenate([self._buffer, *self._chunks])
            self._chunks = []
        offset_s = self._buffer_start / TARGET_RATE
        config, prompt = self.config, self._prompt()
        words, self._segment_ends = decode_words(self.model, self._buffer, config, offset_s, prompt, margin_s,
                                                 word_times)
        windowed = isinstance(self.model, WindowedEncoder)
        for wider in config.recheck_margins_s if final and windowed else ():
            if not _wider(wider, margin_s) or not self._doubtful(words):
                continue
            words, self._segment_ends = decode_words(self.model, self._buffer, config, offset_s, prompt, wider,
                                                     word_times)
        self._heard_words = self._heard_words or bool(words)
        self._last_margin_s = margin_s
        self._last_decode_start_s = offset_s
        self._decoded_to = self._total
        self._last_words = words
        self.decodes += 1
        return words

    def _doubtful(self, words: list[Word]) -> bool:
        """A final decode to check on a wider window: it loops, or hears nothing where an earlier decode of the
        segment heard words (a cough stays one decode)."""
        return repeat_themselves(words) if words else self._heard_words

    def _prompt(self) -> str | None:
        """Committed words that lie before the buffer: the context Whisper no longer hears."""
        cut_s = self._buffer_start / TARGET_RATE
        before = [word for word in self._agreement.committed if word.end <= cut_s + 0.05]
        text = join_words(before)
        return text[-self.config.max_prompt_chars:] if text else None

    def _trim(self) -> None:
        """Cut the buffer at the latest whole-word boundary inside the committed words once it grows long.

        Cutting only at Whisper's segment ends (as whisper_streaming does) made the buffer's length depend on where
        tiny.en happens to close a segment, which differs between CPUs (kernel rounding flips a timestamp token): on a
        short buffer it often emits one segment that runs into the uncommitted tail, and nothing could be cut. Any
        committed word boundary is a safe cut as long as the next word starts a new word (not a piece such as
        "-hearted" of "cold-hearted"): the committed text before the cut becomes the prompt, and words the new buffer
        re-hears before the committed end are dropped by `LocalAgreement.fresh_words`.
        """
        if self.buffer_s <= self.config.trim_after_s:
            return
        cuts: list[float] = []
        if self._agreement.committed:
            cuts = [end for end in self._segment_ends if end <= self._agreement.committed_end + 0.05]
            cuts += whole_word_boundaries(self._agreement.committed, self._agreement.tentative)
            cuts = [cut for cut in cuts if round(cut * TARGET_RATE) > self._buffer_start]  # only cuts that shorten it
        if not cuts:
            if self.buffer_s <= self.config.force_trim_after_s:
                return
            cuts = [self._force_commit()]
        cut = min(round(max(cuts) * TARGET_RATE), self._decoded_to)
        if cut > self._buffer_start:
            self._buffer = self._buffer[cut - self._buffer_start:]
            self._buffer_start = cut

    def _force_commit(self) -> float:
        """LocalAgreement stopped committing (noise, a looping model) and the buffer nears Whisper's 30 s: accept the
        last decode's words that lie before the newest `trim_after_s` and return where to cut (never inside a word).
        """
        keep_from_s = self._decoded_to / TARGET_RATE - self.config.trim_after_s
        tentative = self._agreement.tentative
        forced = 0
        while forced < len(tentative) and tentative[forced].end <= keep_from_s:
            forced += 1
        self._agreement.committed.extend(tentative[:forced])
        self._agreement.tentative = tentative[forced:]
        if forced:
            return tentative[forced - 1].end
        return max(keep_from_s, self._agreement.committed_end)

    def _hypothesis(self, final: bool) -> Hypothesis:
        committed = join_words(self._agreement.committed)
        text = join_words([*self._agreement.committed, *self._agreement.tentative])
        return Hypothesis(committed, text, final, self._decoded_to / TARGET_RATE)


def transcribe_file(path: str | Path, model: Any | None = None, config: TranscriberConfig | None = None) -> str:
    """Offline transcript of a whole WAV file with the same model and decode options as streaming, on Whisper's full
    30 s window as offline faster-whisper decodes it (`config.final_margin_s` set: that window instead). The reference
    that streaming finals are checked against."""
    if model is None:
        from voice.listen.asr_models import load_model

        model = load_model().model
    audio = load_audio_16k(path)
    config = config or replace(TranscriberConfig(), final_margin_s=None)
    words, _ = decode_words(model, audio, config, window_margin_s=config.final_margin_s)
    return join_words(words)
