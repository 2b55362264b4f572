"""The user turns of a long single-session conversation, none of which the tests use.

Questions an assistant hears, synthesised once with the bundled Piper voice (cached like the report's own), interleaved
with real recordings: the spoken card names of pocketsphinx-testdata and the channel names of alsa-utils' test sounds.
The LibriVox clips are left out: the tests use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from scripts.report_lib.inputs import synthesised_questions
from scripts.report_lib.speech_samples import TESTDATA_DIR

T = TypeVar("T")

ALSA_SOUNDS = Path("/usr/share/sounds/alsa")
SOAK_QUESTIONS: tuple[str, ...] = (
    "Good morning, how are you today?",
    "What is a good name for a cat?",
    "How long should I rest after a run?",
    "Can you suggest a quick breakfast?",
    "What is the tallest mountain in Europe?",
    "Why do leaves change colour in autumn?",
    "How many legs does a spider have?",
    "Tell me something about the Roman Empire.",
    "What is a healthy snack for the afternoon?",
    "How do I keep my houseplants alive?",
    "What time of year is best to visit Japan?",
    "Can you help me plan a birthday party?",
    "What is the difference between a frog and a toad?",
    "How do bees make honey?",
    "Should I learn Spanish or French first?",
    "What is a good exercise for my back?",
    "How do I make my coffee less bitter?",
    "Why do cats purr?",
    "What is the speed of sound?",
    "Give me an idea for a weekend trip.",
    "How can I be more productive at work?",
    "What does a marine biologist do?",
    "Which planet has the most moons?",
    "How do I clean a cast iron pan?",
    "What is a nice gift for my grandmother?",
    "Why is the ocean salty?",
    "How often should I water a cactus?",
    "What is the best way to learn to swim?",
    "Can you tell me a short joke?",
    "Thank you, that was helpful.",
)


def recorded_turns(testdata: Path = TESTDATA_DIR, alsa: Path = ALSA_SOUNDS) -> list[Path]:
    """Real recordings the tests do not use: card names and the alsa channel names (not its noise clip)."""
    cards = sorted((testdata / "cards").glob("*.wav"))
    channels = [p for p in sorted(alsa.glob("*.wav")) if p.stem != "Noise"]
    return cards + channels


def interleave(questions: Sequence[T], recorded: Sequence[T], count: int) -> list[T]:
    """`count` turns: two questions, then one recording, repeating; each list cycles when it runs out."""
    order: list[T] = []
    q = r = 0
    while len(order) < count:
        if recorded and len(order) % 3 == 2:
            order.append(recorded[r % len(recorded)])
            r += 1
        else:
            order.append(questions[q % len(questions)])
            q += 1
    return order


def soak_turns(count: int) -> list[Path]:
    """The soak's `count` turns as audio: synthesised questions interleaved with real recordings."""
    return interleave(synthesised_questions(questions=SOAK_QUESTIONS), recorded_turns(), count)
