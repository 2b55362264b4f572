"""What the session knows of one user turn until its `TurnEnd`: its own module, below the answer that carries it and
the records that end it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TurnRecord:
    """What the session knows of one user turn (spoken or typed) until its TurnEnd."""

    turn: int
    user_text: str = ""
    marks: dict[str, int] = field(default_factory=dict)
    endpoint_detected_ns: int | None = None
