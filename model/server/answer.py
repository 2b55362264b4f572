"""What a client may see of an answer while it is being refined: a pure core, no I/O.

The server streams two views of the same drafts. Append-only streams (plain OpenAI) may only send text that will never
change, so they send the committed prefix. `diffusing` streams send the whole current draft each time. Both must honour
`stop` sequences: the answer ends before the first stop string, and text that might turn out to be the start of a stop
string is held back from the committed view, so committed text never has to be taken back.

The model applies the stop strings to what it commits (`GenerationOptions.stop`, model/chat/stop_strings.py): a draft
whose committed text reached one comes already ended there, done with finish_reason "stop", its usage counting only
the tokens returned. So the view applies them only to what the model has not committed: the guess is cut at a stop
string, and the end of the committed text that may start one is held back. (A remote model gets `stop` in its
request: model/chat/client.py.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from model.chat import Draft
from model.chat.stop_strings import cut_at_stop, stable_length
from model.chat.tools import new_call_id, read_calls


@dataclass(frozen=True, slots=True)
class AnswerView:
    """One draft as a client may see it. `committed` is always a prefix of `text`."""

    text: str  # the whole current draft, cut at the first stop string
    committed: str  # the prefix that will never change (stop-safe)
    stopped: bool  # the model ended the answer with finish_reason "stop" (its own end or a stop string): final now


def view_of(draft: Draft, stops: tuple[str, ...]) -> AnswerView:
    """The client's view of `draft`, a draft of the model (stop strings already applied to its committed text). A
    finished draft is committed in full (cancelled ones only up to their commit)."""
    if draft.done:
        final = draft.committed_text if draft.finish_reason == "cancelled" else draft.text
        return AnswerView(text=final, committed=final, stopped=draft.finish_reason == "stop")
    text, _ = cut_at_stop(draft.text, stops)
    committed = draft.committed_text
    committed = committed[: min(stable_length(committed, stops), len(text))]
    if not text.startswith(committed):  # a stop string in the guess cut into the committed part
        text = committed
    return AnswerView(text=text, committed=committed, stopped=False)


class ToolCallDeltas:
    """The `delta.tool_calls` fragments of a stream whose answer is tool calls, from its committed text as it grows:
    a call's `index`, `id`, `type` and `function.name` once its name is committed, then `function.arguments` pieces
    that a client appends (the official client's stream assembles them). Pure: the server sends what `feed` returns.
    """

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._sent: list[int] = []  # characters of each call's arguments already sent

    def feed(self, committed: str) -> list[dict[str, Any]]:
        """The fragments that `committed` (the answer's committed text so far) adds to what was sent."""
        fragments: list[dict[str, Any]] = []
        for index, call in enumerate(read_calls(committed)):
            if index == len(self.ids):
                self.ids.append(new_call_id())
                self._sent.append(0)
                fragments.append({"index": index, "id": self.ids[index], "type": "function",
                                  "function": {"name": call.name, "arguments": ""}})
            if len(call.arguments) > self._sent[index]:
                fragments.append({"index": index, "function": {"arguments": call.arguments[self._sent[index]:]}})
                self._sent[index] = len(call.arguments)
        return fragments
