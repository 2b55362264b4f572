"""What the user actually heard of an answer, phrase by phrase.

Barge-in truncates the chat history to what was spoken, not what was generated. The speaking stage records each
phrase and how many samples of it it handed out; the output side (speaker callback or WebSocket client) records how
many were really played. Kept apart from the speaking stage because it is updated from the audio device's thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PhrasePlayback:
    """One committed phrase: its text, samples handed out, samples played, and whether all its audio was handed out."""

    phrase_id: int
    text: str
    samples_out: int
    samples_played: int
    complete: bool


@dataclass(slots=True)
class _Entry:
    text: str
    samples_out: int = 0
    samples_played: int = 0
    complete: bool = False


class PlaybackLedger:
    """Per-phrase bookkeeping of handed-out and played audio; thread-safe.

    A phrase counts as spoken when all of its audio was handed out and at least `heard_fraction` of its samples were
    played (default 0.8: a listener who heard most of a phrase heard its words; the last fifth is mostly the trailing
    silence and final syllable). A phrase with no audio (only emoji or markup) counts as spoken. `spoken_text` is the
    longest run of spoken phrases from the start, since later audio cannot have been heard before earlier audio.
    """

    def __init__(self, heard_fraction: float = 0.8) -> None:
        if not 0.0 < heard_fraction <= 1.0:
            raise ValueError("heard_fraction must be in (0, 1]")
        self.heard_fraction = heard_fraction
        self._lock = threading.Lock()
        self._phrases: dict[int, _Entry] = {}

    # --- the speaking stage ------------------------------------------------------------------------------------------
    def begin_phrase(self, phrase_id: int, text: str) -> None:
        """A committed phrase whose audio will follow."""
        with self._lock:
            self._phrases.setdefault(phrase_id, _Entry(text))

    def add_audio(self, phrase_id: int, samples: int) -> None:
        """`samples` more samples of the phrase were handed to the output."""
        with self._lock:
            self._entry(phrase_id).samples_out += samples

    def end_phrase(self, phrase_id: int) -> None:
        """All audio of the phrase has been handed out."""
        with self._lock:
            self._entry(phrase_id).complete = True

    # --- the output side ---------------------------------------------------------------------------------------------
    def played(self, phrase_id: int, samples: int) -> None:
        """`samples` more samples of the phrase reached the listener (speaker callback, client acknowledgement)."""
        with self._lock:
            entry = self._entry(phrase_id)
            entry.samples_played = min(entry.samples_out, entry.samples_played + samples)

    def played_total(self, samples: int) -> None:
        """The output played `samples` samples of this answer in all, from its start (a client's playback position);
        they are spread over the phrases in order."""
        with self._lock:
            left = samples
            for phrase_id in sorted(self._phrases):
                entry = self._phrases[phrase_id]
                entry.samples_played = max(entry.samples_played, min(entry.samples_out, left))
                left -= entry.samples_out

    def played_until(self, samples: int) -> None:
        """The output stopped after `samples` samples of this answer in all (a client that truncated its playback
        there): unlike `played_total`, an earlier, larger estimate is corrected down."""
        with self._lock:
            left = samples
            for phrase_id in sorted(self._phrases):
                entry = self._phrases[phrase_id]
                entry.samples_played = max(0, min(entry.samples_out, left))
                left -= entry.samples_out

    # --- readers -----------------------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[PhrasePlayback, ...]:
        with self._lock:
            return tuple(
                PhrasePlayback(pid, e.text, e.samples_out, e.samples_played, e.complete)
                for pid, e in sorted(self._phrases.items())
            )

    def spoken_phrases(self) -> tuple[int, ...]:
        """Ids of the leading phrases the listener heard."""
        spoken: list[int] = []
        for record in self.snapshot():
            heard = record.complete and (
                record.samples_out == 0 or record.samples_played >= self.heard_fraction * record.samples_out
            )
            if not heard or record.phrase_id != len(spoken):
                break
            spoken.append(record.phrase_id)
        return tuple(spoken)

    def spoken_text(self) -> str:
        """The text the listener heard: the spoken phrases joined by spaces."""
        ids = set(self.spoken_phrases())
        return " ".join(record.text for record in self.snapshot() if record.phrase_id in ids)

    def samples_out(self) -> int:
        with self._lock:
            return sum(entry.samples_out for entry in self._phrases.values())

    def _entry(self, phrase_id: int) -> _Entry:
        entry = self._phrases.get(phrase_id)
        if entry is None:
            raise KeyError(f"phrase {phrase_id} was never begun in this ledger")
        return entry
