"""Real recorded speech for tests and benchmarks, from Debian's `pocketsphinx-testdata`.

Five 16 kHz mono sentences (3-7 s) from "Sense and Sensibility" with their transcription (LibriVox); five short
recorded card names ("ten of clubs"); and three short spoken commands stored as headerless 16 kHz PCM ("go forward ten
meters"). Installed by the Makefile's system packages; callers skip (tests) or stop with a clear message (scripts)
when they are absent.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

TESTDATA_DIR = Path(os.environ.get("POCKETSPHINX_TESTDATA", "/usr/share/pocketsphinx/test/data"))
LIBRIVOX_DIR = TESTDATA_DIR / "librivox"
CARDS_DIR = TESTDATA_DIR / "cards"
COMMAND_RAWS = ("goforward", "numbers", "something")
_LINE = re.compile(r"^<s>\s*(?P<text>.*?)\s*</s>\s*\((?P<id>[^)]+)\)\s*$")


@dataclass(frozen=True, slots=True)
class SpeechClip:
    clip_id: str
    path: Path
    text: str


def librivox_clips() -> list[SpeechClip]:
    """Every clip with its reference transcript, in file order; empty when the package is not installed."""
    return _clips(LIBRIVOX_DIR, LIBRIVOX_DIR / "transcription")


def card_clips() -> list[SpeechClip]:
    """Five short recorded commands ("ten of clubs") of the same package: the short turns an assistant hears."""
    return _clips(CARDS_DIR, CARDS_DIR / "cards.transcription")


def command_recordings() -> list[tuple[str, Path]]:
    """The package's three short spoken commands: (name, path) of headerless 16 kHz mono little-endian PCM, no
    transcription shipped ("go forward ten meters", a string of digits, "go somewhere and do something")."""
    return [(name, TESTDATA_DIR / f"{name}.raw") for name in COMMAND_RAWS if (TESTDATA_DIR / f"{name}.raw").is_file()]


def _clips(folder: Path, transcription: Path) -> list[SpeechClip]:
    if not transcription.is_file():
        return []
    clips = []
    for line in transcription.read_text(encoding="utf-8").splitlines():
        match = _LINE.match(line.strip())
        if match and (folder / f"{match['id']}.wav").is_file():
            clips.append(SpeechClip(match["id"], folder / f"{match['id']}.wav", match["text"]))
    return clips
