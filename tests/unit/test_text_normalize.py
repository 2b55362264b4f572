"""Text normalisation for speech: numbers, money, times, abbreviations, symbols, markdown and emoji."""

from __future__ import annotations

import pytest

from voice.speak.text_normalize import (
    normalize_for_speech,
    number_to_words,
    ordinal_to_words,
    strip_emoji,
    strip_markdown,
    year_to_words,
)


@pytest.mark.parametrize(
    ("number", "words"),
    [
        (0, "zero"),
        (13, "thirteen"),
        (40, "forty"),
        (42, "forty-two"),
        (100, "one hundred"),
        (1234, "one thousand two hundred thirty-four"),
        (2_000_005, "two million five"),
        (-7, "minus seven"),
    ],
)
def test_number_to_words(number: int, words: str) -> None:
    assert number_to_words(number) == words


@pytest.mark.parametrize(
    ("number", "words"),
    [(1, "first"), (2, "second"), (3, "third"), (12, "twelfth"), (20, "twentieth"), (22, "twenty-second"),
     (100, "one hundredth"), (111, "one hundred eleventh")],
)  # fmt: skip
def test_ordinal_to_words(number: int, words: str) -> None:
    assert ordinal_to_words(number) == words


@pytest.mark.parametrize(
    ("year", "words"),
    [(1999, "nineteen ninety-nine"), (2000, "two thousand"), (2005, "two thousand five"),
     (2023, "twenty twenty-three"), (1900, "nineteen hundred"), (1905, "nineteen oh five")],
)  # fmt: skip
def test_year_to_words(year: int, words: str) -> None:
    assert year_to_words(year) == words


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("It costs $3.50.", "It costs three dollars and fifty cents."),
        ("About $1.5 million", "About one point five million dollars"),
        ("Only £1 or €20", "Only one pound or twenty euros"),
        ("Pi is 3.14", "Pi is three point one four"),
        ("50% off", "fifty percent off"),
        ("Meet at 3:30 pm or 10:00", "Meet at three thirty p m or ten o'clock"),
        ("Wake at 7am", "Wake at seven a m"),
        ("On the 21st floor", "On the twenty-first floor"),
        ("Born in 1999", "Born in nineteen ninety-nine"),
        ("The 1990s", "The nineteen nineties"),
        ("1,234 people", "one thousand two hundred thirty-four people"),
        ("Pages 3-5", "Pages three to five"),
        ("It was -5 degrees", "It was minus five degrees"),
        ("Dr. Smith vs. Mr. Jones", "Doctor Smith versus Mister Jones"),
        ("Fruit, e.g. apples, etc.", "Fruit, for example, apples, et cetera."),
        ("Tom & Jerry", "Tom and Jerry"),
        ("2 + 2 = 4", "two plus two equals four"),
        ("Mail me @ home", "Mail me at home"),
        ("It is 20°C", "It is twenty degrees Celsius"),
    ],
)
def test_normalize_for_speech(text: str, spoken: str) -> None:
    assert normalize_for_speech(text) == spoken


def test_markdown_never_reaches_the_voice() -> None:
    text = "# Tips\n- **Bold** and *italic* and __strong__\n- Use `print()`\n[docs](https://x.org) ```py\ncode\n```"
    spoken = normalize_for_speech(text)
    assert not set(spoken) & set("#*_`[]") and "()" not in spoken
    assert "Bold and italic and strong" in spoken
    assert "docs" in spoken and "https" not in spoken


def test_strip_markdown_keeps_words() -> None:
    assert strip_markdown("## Heading\n* item one\n1. item two\n> quoted") == "Heading\nitem one\nitem two\nquoted"
    assert strip_markdown("a **half-open bold") == "a half-open bold"  # a phrase may cut markup in two


def test_emoji_are_dropped() -> None:
    assert strip_emoji("Great job 👍🏽! 🎉🎉") == "Great job ! "
    assert normalize_for_speech("Great job 👍🏽!") == "Great job!"
    assert normalize_for_speech("😀 🎉") == ""  # nothing speakable left
    assert normalize_for_speech("👨‍👩‍👧 family") == "family"


def test_a_transcript_trails_off_when_whisper_says_so_or_it_ends_on_a_leaning_word() -> None:
    from voice.listen.words import trails_off

    for text in ("My brother and I...", "is the museum open on the-", "should I take the", "What do you think? What",
                 "I think it’s"):
        assert trails_off(text), text
    for text in ("He was not.", "Front", "bread on the way home", "Is it?", "", "Tell me about it, "[:-2]):
        assert not trails_off(text), text


def test_a_question_is_a_question_mark_after_three_words_or_more() -> None:
    from voice.listen.words import asks_a_question

    for text in ("Can you recommend a good book?", "Is it going to be cold this evening? ", 'He asked "is it far?"'):
        assert asks_a_question(text), text
    for text in ("So what?", "Could you tell me...?", "I was wondering.", "Can you recommend a good", "", "?"):
        assert not asks_a_question(text), text
