"""What one Realtime connection's translator remembers, and what every family of its events uses: ids, the event
envelope, the user item of each session turn. One `TranslatorState` is shared by one object per family
(input_audio_buffer, conversation_items, response_output, responses), each holding it as `state`: the fields below
are what the families share, and the only thing they share; translator.RealtimeTranslator owns them and dispatches.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from voice.turn.tuning import TurnTuning
from web.realtime.actions import Action, Send
from web.realtime.audio import OutputEncoder
from web.realtime.client_events import SessionSettings
from web.realtime.turn_detection import SERVER_TUNING


@dataclass(slots=True)
class UserItem:
    """The user item of one session turn: typed or spoken, and what the client has been told of it."""

    id: str
    typed: bool = False
    committed: bool = False
    explicit: bool = False  # audio the client made an item of (conversation.item.create): answered on request only
    closed: bool = False  # its turn has an answer, or ended without one
    transcript: str = ""
    delta_sent: str = ""


@dataclass(slots=True)
class ResponseState:
    """One answer's response: what it has sent (or holds, unseen) and what its `response.done` will report."""

    id: str
    item_id: str
    turn: int
    held: bool
    held_events: list[dict[str, Any]] = field(default_factory=list)
    # Its spoken user item is not committed yet (the session may release an answer before the segment's end): its
    # events wait in `held_events` for that item's speech_stopped and committed, which the protocol sends first
    before_commit: bool = False
    encoder: OutputEncoder | None = None
    audio_samples: int = 0  # sent, at the client's output rate
    transcript: str = ""
    answer: str = ""
    tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    audio_done: bool = False
    cancel_reason: str | None = None
    error: dict[str, Any] | None = None
    truncated_at: int | None = None  # samples at the session's rate, when the client truncated it while it ran
    message_index: int | None = None  # the assistant message's output index, once it has begun
    calls: list[dict[str, Any]] = field(default_factory=list)  # its function_call items, done
    handed_out: bool = False  # it called a client's tool: it ends with the call, no message
    own_instructions: bool = False  # it ran under its response.create's instructions: the session's come back after


class TranslatorState:
    """One connection's protocol state and the helpers its event families share."""

    def __init__(self, session_id: str, output_sample_rate: int, default_instructions: str,
                 settings: SessionSettings | None = None, server_tuning: TurnTuning = SERVER_TUNING) -> None:
        self.session_id = session_id
        self.server_tuning = server_tuning  # the session's listener as the server configured it
        self.settings = settings or SessionSettings()
        self.output_rate = output_sample_rate
        self.default_instructions = default_instructions
        self._ids = itertools.count(1)
        self._salt = uuid.uuid4().hex[:8]
        self.manual_buffer = bytearray()  # PCM16 at the input format's rate, manual turn detection only
        self.audio_ms = 0  # input audio received, for speech_started / stopped
        self.items: dict[int, UserItem] = {}  # session turn -> its user item
        self.last_item_id: str | None = None
        self.pending_texts: list[tuple[str, str]] = []  # typed user items not yet answered (item id, text)
        self.typed_next: UserItem | None = None  # the typed item the next new session turn is
        self.committed_next: UserItem | None = None  # a manual commit waiting for its session turn
        self.responses: dict[int, ResponseState] = {}  # session turn -> its response
        self.credits = 0  # response.create calls waiting for an answer to release
        self.own_instructions = False  # the next response runs under its response.create's instructions
        self.finished: tuple[str, int, int] | None = None  # the last finished assistant item: (id, turn, ms sent)
        self.calls_out: dict[str, str] = {}  # calls of the client's tools waiting for output: call id -> item id
        self.outputs_in = False  # a function_call_output came since the last response.create

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{self._salt}{next(self._ids):05d}"

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "event_id": self.new_id("event"), **fields}

    def user_item(self, turn: int, spoken: bool) -> UserItem:
        item = self.items.get(turn)
        if item is None:
            if spoken:
                item, self.committed_next = self.committed_next or UserItem(self.new_id("item")), None
            else:
                item, self.typed_next = self.typed_next or UserItem(self.new_id("item"), typed=True), None
            self.items[turn] = item
            for old in [t for t in self.items if t < turn - 8]:  # a long session keeps only recent turns
                del self.items[old]
        return item

    def committed_answer(self, turn: int) -> list[Action]:
        """The spoken user item of `turn` is committed: what its response held back for that goes out now, unless a
        `response.create` must still ask for it."""
        response = self.responses.get(turn)
        if response is None or not response.before_commit:
            return []
        response.before_commit = False
        return [] if response.held else self.send_held(response)

    def send_held(self, response: ResponseState) -> list[Action]:
        """What `response` held back, in order, now sent."""
        events, response.held_events = response.held_events, []
        return [Send(event) for event in events]

    def added_user_item(self, item: UserItem, content: list[dict[str, Any]]) -> Send:
        previous, self.last_item_id = self.last_item_id, item.id
        body = {"id": item.id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
                "content": content}
        return Send(self.event("conversation.item.added", item=body, previous_item_id=previous))

    def open_spoken_item(self) -> UserItem | None:
        """The spoken user item of a turn the session has not answered yet."""
        return next((item for item in self.items.values() if not item.typed and not item.closed), None)
