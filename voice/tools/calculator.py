"""Arithmetic and unit conversion for the voice session's tools, without `eval`: an expression is parsed with `ast`
and only numbers, + - * / // % ** (bounded), unary signs and parentheses are evaluated. No I/O.

A spoken request arrives through Whisper and a small LM, so the evaluator also reads the words they write for the
operators ("times", "plus", "x", "÷") and refuses everything else with a `ToolError` the session speaks as an apology.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable

from voice.errors import ToolError

_MAX_EXPONENT = 1000  # 10**1000 is already beyond any answer worth speaking; 9**9**9 would hang the session
_MAX_CHARS = 200
_WORDS = (
    (r"\bmultiplied by\b|\btimes\b|×|\bx\b", "*"),
    (r"\bdivided by\b|÷|\bover\b", "/"),
    (r"\bplus\b", "+"),
    (r"\bminus\b", "-"),
    (r"\bto the power of\b", "**"),
    (r"\bsquared\b", "**2"),
    (r"\bcubed\b", "**3"),
    (r"(?<=\d),(?=\d{3}\b)", ""),  # 1,000 -> 1000
)
_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def calculate(expression: str) -> float:
    """The value of an arithmetic expression such as "12 * (3 + 4)" or "7 times 6"."""
    text = expression.strip().lower()
    if not text or len(text) > _MAX_CHARS:
        raise ToolError("I can only work out a short sum")
    for pattern, replacement in _WORDS:
        text = re.sub(pattern, replacement, text)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise ToolError(f"I could not read {expression!r} as a sum") from error
    try:
        value = _evaluate(tree.body)
    except ZeroDivisionError as error:
        raise ToolError("that divides by zero") from error
    except OverflowError as error:
        raise ToolError("that number is too large") from error
    if isinstance(value, complex) or not math.isfinite(value):
        raise ToolError("that has no real answer")
    return value


def _evaluate(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > _MAX_EXPONENT:
                raise ToolError("that power is too large")
            return float(left) ** right  # in floats, so a tower of powers overflows at once instead of growing
        return _BINARY[type(node.op)](left, right)
    raise ToolError("I can only do arithmetic: numbers with plus, minus, times, divided by and powers")


def spoken_number(value: float) -> str:
    """A result as a listener wants it: whole numbers without ".0", others to at most 6 significant digits."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


# --- units -----------------------------------------------------------------------------------------------------------
# Each unit in its dimension's base unit (metre, kilogram, second, litre, metre/second, byte); temperature is affine
# and handled apart.
_UNITS: dict[str, tuple[str, float]] = {}


def _add(dimension: str, factor: float, *names: str) -> None:
    for name in names:
        _UNITS[name] = (dimension, factor)


_add("length", 1.0, "m", "meter", "meters", "metre", "metres")
_add("length", 1000.0, "km", "kilometer", "kilometers", "kilometre", "kilometres")
_add("length", 0.01, "cm", "centimeter", "centimeters", "centimetre", "centimetres")
_add("length", 0.001, "mm", "millimeter", "millimeters", "millimetre", "millimetres")
_add("length", 0.0254, "in", "inch", "inches")
_add("length", 0.3048, "ft", "foot", "feet")
_add("length", 0.9144, "yd", "yard", "yards")
_add("length", 1609.344, "mi", "mile", "miles")
_add("mass", 1.0, "kg", "kilogram", "kilograms", "kilo", "kilos")
_add("mass", 0.001, "g", "gram", "grams")
_add("mass", 0.45359237, "lb", "lbs", "pound", "pounds")
_add("mass", 0.028349523125, "oz", "ounce", "ounces")
_add("mass", 1000.0, "t", "tonne", "tonnes", "ton", "tons")
_add("mass", 6.35029318, "st", "stone", "stones")
_add("time", 1.0, "s", "sec", "second", "seconds")
_add("time", 60.0, "min", "minute", "minutes")
_add("time", 3600.0, "h", "hr", "hour", "hours")
_add("time", 86400.0, "day", "days")
_add("time", 604800.0, "week", "weeks")
_add("volume", 1.0, "l", "liter", "liters", "litre", "litres")
_add("volume", 0.001, "ml", "milliliter", "milliliters", "millilitre", "millilitres")
_add("volume", 3.785411784, "gal", "gallon", "gallons")
_add("volume", 0.946352946, "quart", "quarts")
_add("volume", 0.473176473, "pint", "pints")
_add("volume", 0.2365882365, "cup", "cups")
_add("speed", 1.0, "m/s", "meters per second", "metres per second")
_add("speed", 1000 / 3600, "km/h", "kph", "kmh", "kilometers per hour", "kilometres per hour")
_add("speed", 1609.344 / 3600, "mph", "miles per hour")
_add("speed", 1852 / 3600, "knot", "knots")
_add("data", 1.0, "b", "byte", "bytes")
_add("data", 1e3, "kb", "kilobyte", "kilobytes")
_add("data", 1e6, "mb", "megabyte", "megabytes")
_add("data", 1e9, "gb", "gigabyte", "gigabytes")
_add("data", 1e12, "tb", "terabyte", "terabytes")

# Temperature: (to kelvin, from kelvin)
_TEMPERATURES: dict[str, tuple[Callable[[float], float], Callable[[float], float]]] = {}
for _names, _to, _from in (
    (("c", "°c", "celsius", "centigrade", "degrees celsius"), lambda v: v + 273.15, lambda k: k - 273.15),
    (
        ("f", "°f", "fahrenheit", "degrees fahrenheit"),
        lambda v: (v - 32) * 5 / 9 + 273.15,
        lambda k: (k - 273.15) * 9 / 5 + 32,
    ),
    (("k", "kelvin", "kelvins"), lambda v: v, lambda k: k),
):
    for _name in _names:
        _TEMPERATURES[_name] = (_to, _from)


def _unit(name: str) -> str:
    return " ".join(name.strip().lower().replace("degree ", "degrees ").split())


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """`value` in `from_unit` expressed in `to_unit` (length, mass, time, volume, speed, data size, temperature)."""
    source, target = _unit(from_unit), _unit(to_unit)
    if source in _TEMPERATURES and target in _TEMPERATURES:
        return _TEMPERATURES[target][1](_TEMPERATURES[source][0](value))
    if source not in _UNITS:
        raise ToolError(f"I don't know the unit {from_unit}")
    if target not in _UNITS:
        raise ToolError(f"I don't know the unit {to_unit}")
    (dimension, factor), (target_dimension, target_factor) = _UNITS[source], _UNITS[target]
    if dimension != target_dimension:
        raise ToolError(f"{from_unit} cannot be converted to {to_unit}")
    return value * factor / target_factor
