"""What the session knows of each user turn until its `TurnEnd`, and how a turn ends: the history keeps the user's
words and what the listener really heard of the answer, and the `TurnEnd` event carries the turn's latencies."""

from __future__ import annotations

from typing import TYPE_CHECKING

from model.chat import ChatMessage
from voice.events import TurnEnd
from voice.latency import breakdown
from voice.think.dialogue import Dialogue
from voice.turn.record import TurnRecord

if TYPE_CHECKING:
    from voice.turn.answer import Answer


class TurnRecords:
    """The open turns' records by turn number, and the conversation's history they end into."""

    def __init__(self, session_id: str, dialogue: Dialogue) -> None:
        self.session_id = session_id
        self.dialogue = dialogue
        self._records: dict[int, TurnRecord] = {}
        self._last_answer: tuple[int, Answer] | None = None  # the newest ended turn's answer, for `truncate`
        self._results_waiting: list[str] = []  # tool results returned while an answer ran: history at its end

    def get(self, turn: int) -> TurnRecord:
        """The turn's record, made on first use."""
        record = self._records.get(turn)
        if record is None:
            record = self._records[turn] = TurnRecord(turn)
        return record

    def mark(self, turn: int, marks: dict[str, int], endpoint_detected_ns: int | None = None) -> None:
        """Record when moments of `turn` happened, by name; its latencies are folded from them when it ends."""
        record = self.get(turn)
        record.marks.update(marks)
        if endpoint_detected_ns is not None:
            record.endpoint_detected_ns = endpoint_detected_ns

    def renumber(self, record: TurnRecord, turn: int) -> None:
        """The record's turn goes on as `turn` (a dropped early answer: the user kept speaking)."""
        record = self._records.pop(record.turn, record)
        record.turn = turn
        self._records[record.turn] = record

    def add_tool_result(self, output: str, answering: bool) -> None:
        """A client's function result joins the history: now, or, while an answer is `answering`, once its turn has
        ended (after that turn's messages)."""
        if answering:
            self._results_waiting.append(output)
        else:
            self.dialogue.add_tool_messages([ChatMessage("tool", output)])

    def messages_with(self, user_text: str) -> list[ChatMessage]:
        """The history plus this turn's words; the history itself changes only when the turn ends."""
        probe = Dialogue(self.dialogue.config, self.dialogue.history)
        probe.add_user(user_text)
        return probe.messages()

    def messages(self) -> list[ChatMessage]:
        """The history as it is: what a turn with no user words answers (tool results a client returned)."""
        return self.dialogue.messages()

    def end(self, record: TurnRecord, answer: Answer | None, interrupted: bool, stats: dict[str, float]) -> TurnEnd:
        """Close the turn: the history gets the user's words and what was spoken; returns its `TurnEnd`."""
        self._records.pop(record.turn, None)
        if answer is None:
            answer_text, spoken, marks = "", "", dict(record.marks)
        else:
            marks = {**record.marks, **answer.marks}
            answer_text = answer.text
            if interrupted:
                answer.playback.ledger.played_total(answer.playback.played_estimate())
                spoken = _heard(answer)
            else:
                spoken = answer.text
        if answer is not None and answer.announcement is not None:
            stats = {**stats, "announcement": 1.0}  # the assistant's own turn: no user words
        else:
            if answer is None or not answer.continues:  # a continuation answers the history: no words of its own
                self.dialogue.add_user(record.user_text)
            if answer is not None:
                self.dialogue.add_tool_messages(answer.tool_messages)
        self.dialogue.add_assistant(spoken)
        results, self._results_waiting = self._results_waiting, []
        self.dialogue.add_tool_messages([ChatMessage("tool", output) for output in results])
        self._last_answer = None if answer is None or answer.announcement is not None else (record.turn, answer)
        return TurnEnd(
            session=self.session_id,
            turn=record.turn,
            user_text=record.user_text,
            answer=answer_text,
            spoken=spoken,
            interrupted=interrupted,
            latency_ms=breakdown(marks, record.endpoint_detected_ns),
            stats=dict(stats),
        )

    def truncate(self, turn: int, samples: int) -> str | None:
        """The listener heard only the first `samples` of ended `turn`'s answer (a client that stopped its playback
        there): the history keeps what those samples said. Returns that text, or None when `turn` is not the newest
        ended turn with an answer (its message, if any, is then no longer the history's last)."""
        if self._last_answer is None or self._last_answer[0] != turn:
            return None
        answer = self._last_answer[1]
        answer.playback.ledger.played_until(samples)
        spoken = _heard(answer)
        if not self.dialogue.replace_last_assistant(spoken):
            self.dialogue.add_assistant(spoken)  # it had left no message (nothing heard then); some was, after all
        return spoken


def _heard(answer: Answer) -> str:
    """The answer's text the listener heard, by its playback ledger; the filler said first is not part of it."""
    spoken = answer.playback.ledger.spoken_text()
    said = "".join(piece.text for piece in answer.said).strip()
    return spoken.removeprefix(said).strip() if said else spoken
