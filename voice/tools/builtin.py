"""The tools a voice session has with `--tools`: the local time and date, timers and alarms, arithmetic and
unit conversion. Each is a `Function` (model/chat/tools.py: what the model is offered) and a synchronous body that
takes the parsed arguments and returns the result text the model reads back; none does I/O, so they run on the
event loop. Descriptions are short: the bundled 135M model reads them in its system prompt on every turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from model.chat.tools import Function
from voice.errors import ToolError
from voice.tools.calculator import calculate, convert, spoken_number
from voice.tools.timers import Timers, spoken_clock, spoken_duration, spoken_now


def _schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> str:
    body: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        body["required"] = list(required)
    body["additionalProperties"] = False
    return json.dumps(body, separators=(",", ":"))


_TEXT = {"type": "string"}
_NUMBER = {"type": "number"}

GET_TIME = Function("get_time", "The current local time and date.", _schema({}))
SET_TIMER = Function(
    "set_timer",
    "Start a timer that rings after the given duration.",
    _schema({"hours": _NUMBER, "minutes": _NUMBER, "seconds": _NUMBER, "label": _TEXT}),
)
SET_ALARM = Function(
    "set_alarm", "Set an alarm at a time of day (24-hour HH:MM).", _schema({"time": _TEXT, "label": _TEXT}, ("time",))
)
LIST_TIMERS = Function("list_timers", "The timers and alarms that are set.", _schema({}))
CANCEL_TIMER = Function("cancel_timer", "Cancel timers (those whose label matches, or all).", _schema({"label": _TEXT}))
CALCULATE = Function(
    "calculate", "Work out an arithmetic expression, e.g. 12*(3+4).", _schema({"expression": _TEXT}, ("expression",))
)
CONVERT_UNITS = Function(
    "convert_units",
    "Convert a quantity between units, e.g. 5 miles to km.",
    _schema({"value": _NUMBER, "from_unit": _TEXT, "to_unit": _TEXT}, ("value", "from_unit", "to_unit")),
)
BUILTIN_FUNCTIONS = (GET_TIME, SET_TIMER, SET_ALARM, LIST_TIMERS, CANCEL_TIMER, CALCULATE, CONVERT_UNITS)


@dataclass(slots=True)
class BuiltinTools:
    """The built-in tools of one session, over its timers."""

    timers: Timers

    @property
    def functions(self) -> tuple[Function, ...]:
        return BUILTIN_FUNCTIONS

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run built-in `name` (raises `ToolError` for arguments it cannot use; `KeyError` for an unknown name)."""
        body: Callable[[dict[str, Any]], str] = {
            "get_time": lambda _: spoken_now(self.timers.now()),
            "set_timer": self._set_timer,
            "set_alarm": lambda a: self._alarm_set(self.timers.set_alarm(_text(a, "time"), _text(a, "label"))),
            "list_timers": lambda _: self._list(),
            "cancel_timer": self._cancel,
            "calculate": lambda a: spoken_number(calculate(_text(a, "expression"))),
            "convert_units": self._convert,
        }[name]
        return body(arguments)

    def _set_timer(self, arguments: dict[str, Any]) -> str:
        seconds = (
            _number(arguments, "hours") * 3600 + _number(arguments, "minutes") * 60 + _number(arguments, "seconds")
        )
        timer = self.timers.set(seconds, _text(arguments, "label"))
        return f"Timer set for {spoken_duration(timer.seconds)}."

    @staticmethod
    def _alarm_set(timer: Any) -> str:
        return f"Alarm set for {spoken_clock(timer.alarm)}."

    def _list(self) -> str:
        pending = self.timers.pending()
        if not pending:
            return "No timers are set."
        lines = []
        for timer in pending:
            name = f"{timer.label} " if timer.label else ""
            if timer.alarm is not None:
                lines.append(f"{name}alarm at {spoken_clock(timer.alarm)}")
            else:
                lines.append(f"{name}timer with {spoken_duration(self.timers.remaining(timer))} left")
        return "; ".join(lines) + "."

    def _cancel(self, arguments: dict[str, Any]) -> str:
        gone = self.timers.cancel(_text(arguments, "label"))
        return f"Cancelled {len(gone)} timer{'s' if len(gone) > 1 else ''}."

    @staticmethod
    def _convert(arguments: dict[str, Any]) -> str:
        value, source, target = _number(arguments, "value"), _text(arguments, "from_unit"), _text(arguments, "to_unit")
        return f"{spoken_number(value)} {source} is {spoken_number(convert(value, source, target))} {target}."


def _number(arguments: dict[str, Any], key: str) -> float:
    value = arguments.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError(f"the {key} must be a number")
    return float(value)


def _text(arguments: dict[str, Any], key: str) -> str:
    value = arguments.get(key, "")
    if not isinstance(value, str):
        raise ToolError(f"the {key} must be words")
    return value
