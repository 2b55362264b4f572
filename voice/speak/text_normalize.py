"""Text normalisation for speech: what the model writes, turned into words the voice reads correctly.

Piper reads its input through espeak-ng, which misreads years ("1999" as "one thousand nine hundred..."), currency
amounts, clock times, markdown markup and emoji. A language model's answer is full of these, so every phrase passes
through `normalize_for_speech` before synthesis. All functions here are pure.
"""

from __future__ import annotations

import re
import unicodedata

_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
)  # fmt: skip
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_WORDS = {
    "one": "first", "two": "second", "three": "third", "four": "fourth", "five": "fifth", "six": "sixth",
    "seven": "seventh", "eight": "eighth", "nine": "ninth", "twelve": "twelfth",
}  # fmt: skip
_DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def number_to_words(number: int) -> str:
    """Cardinal words for an integer: 1234 -> "one thousand two hundred thirty-four"."""
    if number < 0:
        return "minus " + number_to_words(-number)
    if number < 20:
        return _ONES[number]
    if number < 100:
        tens, ones = divmod(number, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    if number < 1000:
        hundreds, rest = divmod(number, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {number_to_words(rest)}" if rest else "")
    for scale, name in _SCALES:
        if number >= scale:
            head, rest = divmod(number, scale)
            return f"{number_to_words(head)} {name}" + (f" {number_to_words(rest)}" if rest else "")
    raise AssertionError("unreachable: every number >= 1000 has a scale")


def ordinal_to_words(number: int) -> str:
    """Ordinal words: 1 -> "first", 22 -> "twenty-second", 100 -> "one hundredth"."""
    words = number_to_words(number)
    head, sep, last = words.rpartition("-") if "-" in words.split(" ")[-1] else words.rpartition(" ")
    if last in _ORDINAL_WORDS:
        last = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + sep + last


def year_to_words(year: int) -> str:
    """A year the way people say it: 1999 -> "nineteen ninety-nine", 2005 -> "two thousand five", 2023 -> "twenty
    twenty-three"."""
    century, rest = divmod(year, 100)
    if (year % 1000 < 10 and year >= 2000) or year % 1000 == 0:
        return number_to_words(year)
    if rest == 0:
        return f"{number_to_words(century)} hundred"
    if rest < 10:
        return f"{number_to_words(century)} oh {_ONES[rest]}"
    return f"{number_to_words(century)} {number_to_words(rest)}"


def decimal_to_words(text: str) -> str:
    """Digits with an optional fraction, commas allowed: "1,234.05" -> "one thousand two hundred thirty-four point
    zero five"."""
    whole, _, fraction = text.replace(",", "").partition(".")
    words = number_to_words(int(whole or "0"))
    if fraction:
        words += " point " + " ".join(_DIGIT_WORDS[int(d)] for d in fraction)
    return words


# --- markdown and emoji -----------------------------------------------------------------------------------------------
_CODE_FENCE = re.compile(r"```[^\n]*\n?|~~~[^\n]*\n?")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_URL = re.compile(r"\bhttps?://(?:www\.)?([^\s)]+)")
_HEADING = re.compile(r"^[ \t]*#{1,6}[ \t]+", re.MULTILINE)
_BULLET = re.compile(r"^[ \t]*(?:[-*+•]|\d+[.)])[ \t]+", re.MULTILINE)
_QUOTE = re.compile(r"^[ \t]*>[ \t]?", re.MULTILINE)
_RULE = re.compile(r"^[ \t]*(?:[-*_][ \t]*){3,}$", re.MULTILINE)
_EMPHASIS = re.compile(r"(\*{1,3}|_{2,3}|~~)")
_UNDERSCORE_EMPHASIS = re.compile(r"(?<![\w])_(?=\S)|(?<=\S)_(?![\w])")
_TABLE_BAR = re.compile(r"\s*\|\s*")


def strip_markdown(text: str) -> str:
    """Remove markdown markup but keep its words: headings, bullets, bold/italics, code, links, quotes, tables."""
    text = _CODE_FENCE.sub("", text)
    text = text.replace("`", "")
    text = _LINK.sub(r"\1", text)
    text = _URL.sub(lambda m: m.group(1).rstrip("/").replace(".", " dot ").replace("/", " slash "), text)
    text = _RULE.sub("", text)
    text = _HEADING.sub("", text)
    text = _QUOTE.sub("", text)
    text = _BULLET.sub("", text)
    text = _EMPHASIS.sub("", text)
    text = _UNDERSCORE_EMPHASIS.sub("", text)
    return _TABLE_BAR.sub(", ", text) if "|" in text else text


_SPOKEN_SYMBOLS = {
    "°C": " degrees Celsius", "°F": " degrees Fahrenheit", "°": " degrees", "©": " copyright ", "®": "", "™": "",
    "€": "€", "£": "£",
}  # fmt: skip


def strip_emoji(text: str) -> str:
    """Drop emoji and pictographs (and their joiners and variation selectors); keep letters, digits, punctuation."""
    for symbol in ("°C", "°F"):
        text = text.replace(symbol, _SPOKEN_SYMBOLS[symbol])
    kept: list[str] = []
    for char in text:
        if char in _SPOKEN_SYMBOLS:
            kept.append(_SPOKEN_SYMBOLS[char])
            continue
        category = unicodedata.category(char)
        if category in ("So", "Cs", "Co") or char in "\u200d\ufe0e\ufe0f\u20e3" or "\U0001f3fb" <= char <= "\U0001f3ff":
            continue
        kept.append(char)
    return "".join(kept)


# --- numbers, money, times -------------------------------------------------------------------------------------------
_CURRENCY = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
             "£": ("pound", "pounds", "penny", "pence")}  # fmt: skip
_MONEY = re.compile(r"([$€£])\s?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?(?:\s?(thousand|million|billion|trillion)\b)?")
_PERCENT = re.compile(r"(-?\d+(?:,\d{3})*(?:\.\d+)?)\s?%")
_TIME = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)\b(?:\s?([AaPp])\.?\s?[Mm]\b\.?)?")
_AMPM = re.compile(r"\b(\d{1,2})\s?([AaPp])\.?[Mm]\b\.?")
_ORDINAL = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_YEAR = re.compile(r"(?<![\d,.$€£])\b(1[1-9]\d\d|20\d\d)\b(?![.,]\d|\s?%)")
_DECADE = re.compile(r"\b(1[1-9]|20)(\d)0s\b")
_RANGE = re.compile(r"(?<=\d)\s?[-–]\s?(?=\d)")
_NUMBER = re.compile(r"(?<![\w.])(-?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\d])")


def _money(match: re.Match[str]) -> str:
    singular, plural, minor_one, minor_many = _CURRENCY[match.group(1)]
    whole, cents, scale = match.group(2).replace(",", ""), match.group(3), match.group(4)
    if scale:
        amount = decimal_to_words(whole + (f".{cents}" if cents else ""))
        return f"{amount} {scale} {plural}"
    words = f"{number_to_words(int(whole))} {singular if int(whole) == 1 else plural}"
    if cents and int(cents):
        minor = int(cents.ljust(2, "0"))
        words += f" and {number_to_words(minor)} {minor_one if minor == 1 else minor_many}"
    return words


def _time(match: re.Match[str]) -> str:
    hours, minutes, half = int(match.group(1)), int(match.group(2)), match.group(3)
    if minutes == 0:
        words = number_to_words(hours) + ("" if half else " o'clock")
    elif minutes < 10:
        words = f"{number_to_words(hours)} oh {_ONES[minutes]}"
    else:
        words = f"{number_to_words(hours)} {number_to_words(minutes)}"
    return words + (f" {half.lower()} m" if half else "")


def _number(match: re.Match[str]) -> str:
    sign, whole, fraction = match.group(1), match.group(2), match.group(3) or ""
    return ("minus " if sign else "") + decimal_to_words(whole + fraction)


def _decade(match: re.Match[str]) -> str:
    words = year_to_words(int(match.group(1) + match.group(2) + "0"))
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _percent(match: re.Match[str]) -> str:
    value = match.group(1)
    sign = "minus " if value.startswith("-") else ""
    return f"{sign}{decimal_to_words(value.lstrip('-'))} percent"


def normalize_numbers(text: str) -> str:
    """Spell out money, percentages, clock times, ordinals, years, decimals and integers."""
    text = _MONEY.sub(_money, text)
    text = _PERCENT.sub(_percent, text)
    text = _TIME.sub(_time, text)
    text = _AMPM.sub(lambda m: f"{number_to_words(int(m.group(1)))} {m.group(2).lower()} m", text)
    text = _ORDINAL.sub(lambda m: ordinal_to_words(int(m.group(1))), text)
    text = _DECADE.sub(_decade, text)
    text = _YEAR.sub(lambda m: year_to_words(int(m.group(1))), text)
    text = _RANGE.sub(" to ", text)
    return _NUMBER.sub(_number, text)


# --- abbreviations and symbols ---------------------------------------------------------------------------------------
_ABBREVIATIONS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), spoken)
    for pattern, spoken in (
        (r"\be\.g\.,?", "for example,"),
        (r"\bi\.e\.,?", "that is,"),
        (r"\betc\.", "et cetera."),
        (r"\bvs\.?(?=\s)", "versus"),
        (r"\bapprox\.", "approximately"),
        (r"\bDr\.(?=\s)", "Doctor"),
        (r"\bMr\.(?=\s)", "Mister"),
        (r"\bMrs\.(?=\s)", "Missus"),
        (r"\bMs\.(?=\s)", "Miz"),
        (r"\bProf\.(?=\s)", "Professor"),
        (r"\bSt\.(?=\s+[A-Z])", "Saint"),
        (r"\bSt\.", "Street"),
        (r"\bJr\.", "Junior"),
        (r"\bSr\.", "Senior"),
        (r"\bNo\.(?=\s*\d)", "number"),
        (r"\bmin\.(?=\s)", "minutes"),
        (r"\bkm\b", "kilometers"),
        (r"\bkg\b", "kilograms"),
    )
)
_SYMBOLS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), spoken)
    for pattern, spoken in (
        (r"\(\s*\)", ""),
        (r"\s*&\s*", " and "),
        (r"%", " percent"),
        (r"(?<=\w)\s*\+\s*(?=\w)|(?<=\s)\+(?=\s)", " plus "),
        (r"\+", " plus "),
        (r"\s*=\s*", " equals "),
        (r"(?<=\w)@(?=\w)", " at "),
        (r"\s*@\s*", " at "),
        (r"#(?=\d)", "number "),
        (r"#", ""),
        (r"(?<=\d)\s*[×x*]\s*(?=\d)", " times "),
        (r"\*", ""),
        (r"(?<=\w)/(?=\w)", " slash "),
        (r"[<>]=?|[\[\]{}^|\\~_]", " "),
        (r"\s[-–—]+\s", ", "),
    )
)
_APPROX = re.compile(r"~\s*(?=[$€£]?\d)")
_SPACES = re.compile(r"[ \t]+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")
_LINES = re.compile(r"\s*\n\s*")


def normalize_for_speech(text: str) -> str:
    """The text a voice should read for `text`: markdown and emoji removed, numbers, abbreviations and symbols spelled
    out, line breaks turned into pauses, whitespace collapsed. Returns "" when nothing speakable is left."""
    text = unicodedata.normalize("NFC", text)
    text = strip_markdown(text)
    text = strip_emoji(text)
    for pattern, spoken in _ABBREVIATIONS:
        text = pattern.sub(spoken, text)
    text = _APPROX.sub("about ", text)
    text = normalize_numbers(text)
    for pattern, spoken in _SYMBOLS:
        text = pattern.sub(spoken, text)
    text = _LINES.sub(". ", text.strip())
    text = _SPACES.sub(" ", text)
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    text = text.replace("..", ".").strip(" ,;")
    return text if any(char.isalnum() for char in text) else ""
