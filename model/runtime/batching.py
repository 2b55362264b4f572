"""One forward pass over the passes of several answers: per-sequence KV caches in one batch (the bundled model's form).

Each answer being decoded is a *sequence* with its own row (slot) of a `SlotCache` and its own cached length. A pass of
one sequence feeds a `Feed`: clean tokens (causal, adapter gate off: exactly the teacher) followed by noisy tokens
(gate on, bidirectional among themselves, seeing every clean token; clean rows never see them). Sequences differ in
both their cached length and their rows per pass, so the batch is laid out as::

    row i:  [ clean_i | pad ... | noisy_i ]        S = max(len(clean_i) + len(noisy_i)) columns
    keys:   slot i holds its cache at [0, L_i); this pass writes its S rows at [L_i, L_i + S)

Rotary positions are each sequence's own (L_i + j for clean row j, L_i + len(clean_i) + j for noisy row j), and keys
are cached after the rotation, so where a key sits in the slot does not matter: only the attention mask does. A row
sees its own slot's cached keys and the new keys its pattern allows, nothing else: not the stale keys past L_i + S,
not another pass's padding. Padding rows attend only to themselves (a row that attends to nothing gives NaN) and their
outputs are thrown away. Padding sits between the clean and the noisy rows so that every sequence's noisy rows are
its last columns: the adapter runs only on the columns from the longest noisy run on (`_Gate.suffix_from`), masked
where a sequence has fewer noisy rows, never on the clean rows before them.

After the pass a sequence keeps its first `keep` clean rows (accepted tokens; a finished block) by moving its length
forward; everything after is overwritten by its next pass, as in gpt-fast's preallocated cache: no crop, no copy.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from transformers.cache_utils import Cache

from model.decoding.step import Feed
from model.device import upload
from model.errors import GenerationCancelled, ModelError
from model.runtime.noisy_rows import noisy_suffix

PREFILL_CHUNK = 1024  # at most this many prompt tokens per prefill forward (see `prefill`)
MIN_PREFILL_BUCKET = 32
GROWTH = 256  # slot capacity grows in steps of at least this many positions
KEEP_AFTER_ANSWER = 2048  # a finished answer's slot keeps at most this many tokens for the next prompt to reuse
# Every pass attends over a key length rounded up to this (the keys past a slot's length are masked). A bf16 matmul on
# the CPU sums its reduction dimension in an order that depends on its length, so attention over L + 1 keys (an
# autoregressive step) and over L + 16 keys (a self-speculative pass) rounded the same query's output differently now
# and then; over the same rounded length the sums match bit for bit (see `pass_layout`).
KEY_MULTIPLE = 32


@dataclass(frozen=True, slots=True)
class LayerBuffers:
    """Every layer's key and value buffers of a `SlotCache` as the decode kernel takes them (`decode_layers`): arrays
    of their data pointers, and of each one's capacity."""

    keys: ctypes.Array
    values: ctypes.Array
    capacity: ctypes.Array

    @staticmethod
    def of(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> LayerBuffers:
        layers = len(pairs)
        return LayerBuffers((ctypes.c_void_p * layers)(*(k.data_ptr() for k, _ in pairs)),
                            (ctypes.c_void_p * layers)(*(v.data_ptr() for _, v in pairs)),
                            (ctypes.c_int64 * layers)(*(k.shape[2] for k, _ in pairs)))


@dataclass(slots=True)
class Slot:
    """One sequence's row of the cache: the tokens whose keys/values it holds at [0, len(ids))."""

    ids: list[int] = field(default_factory=list)


class SlotCache(Cache):
    """Keys/values of up to `slots` sequences, one row each, every row its own length.

    Before each forward the caller says which slots the batch rows are (`rows`) and where each row's new keys go
    (`offsets`, the slot's cached length); `update` writes them there and returns the keys every row may need, up to
    the longest `offset + S`. Buffers grow on demand; rows past a slot's length hold stale keys that the mask hides.
    """

    def __init__(self, slots: int) -> None:
        super().__init__(layers=[])
        self.slots = [Slot() for _ in range(slots)]
        self._keys: list[torch.Tensor] = []  # per layer: [slots, heads, capacity, head_dim]
        self._values: list[torch.Tensor] = []
        self.rows: list[int] = []
        self.offsets: list[int] = []
        self._where: tuple[torch.Tensor, torch.Tensor] | None = None  # (slot, position) `[B, S]` of this forward's rows
        self._pointers: LayerBuffers | None = None  # `layer_buffers`' answer while no buffer has changed

    def bind(self, rows: Sequence[int], offsets: Sequence[int]) -> None:
        self.rows, self.offsets = list(rows), list(offsets)
        self._where = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states: [B, heads, S, head_dim] for the rows bound by `bind`
        s = key_states.shape[2]
        end = round_up(max(offset + s for offset in self.offsets), KEY_MULTIPLE)
        keys, values = self.buffers(layer_idx, end, key_states)
        if len(self.rows) == 1:  # one answer (every lone pass): a slice copy, ~4x cheaper than the indexed write
            row, offset = self.rows[0], self.offsets[0]
            keys[row, :, offset : offset + s].copy_(key_states[0])
            values[row, :, offset : offset + s].copy_(value_states[0])
        else:
            if self._where is None or self._where[0].shape[1] != s:  # once per forward: every layer writes there
                slot_index = upload(torch.tensor(self.rows), keys.device).unsqueeze(1).expand(-1, s)  # [B, S]
                offsets = upload(torch.tensor(self.offsets), keys.device)
                position = offsets.unsqueeze(1) + torch.arange(s, device=keys.device)
                self._where = (slot_index, position)
            slot_index, position = self._where
            keys[slot_index, :, position] = key_states.transpose(1, 2)  # [B, S, heads, head_dim]: one write for all
            values[slot_index, :, position] = value_states.transpose(1, 2)
        first, last = self.rows[0], self.rows[-1]
        if self.rows == list(range(first, last + 1)):  # the usual case: a view, no copy
            return keys[first : last + 1, :, :end], values[first : last + 1, :, :end]
        index = upload(torch.tensor(self.rows), keys.device)
        return keys[index, :, :end], values[index, :, :end]

    def buffers(self, layer: int, needed: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s key and value buffers `[slots, heads, capacity, head_dim]`, with room for `needed`
        positions; made on a first call, with the heads, head size, dtype and device of `like` `[B, heads, S, D]`."""
        if layer == len(self._keys):
            shape = (len(self.slots), like.shape[1], 0, like.shape[3])
            self._keys.append(like.new_zeros(shape))
            self._values.append(like.new_zeros(shape))
        return self._grow(layer, needed)

    def layer_buffers(self, layers: int, needed: int, like: torch.Tensor) -> LayerBuffers:
        """`buffers` of layers 0 .. `layers` - 1 at once, as the decode kernel takes a whole pass: their data
        pointers and capacities, kept while no buffer changes (a pass of the decode kernel then touches no tensor
        here). The buffers must be contiguous, as they are made."""
        known = self._pointers
        if known is None or len(known.keys) != layers or min(known.capacity) < needed:
            pairs = [self.buffers(layer, needed, like) for layer in range(layers)]
            if not all(t.is_contiguous() and t.dtype == like.dtype for pair in pairs for t in pair):
                raise ValueError("the cache's buffers must be contiguous and of the pass's dtype")
            self._pointers = LayerBuffers.of(pairs)
        return self._pointers

    def _grow(self, layer: int, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._keys[layer], self._values[layer]
        if keys.shape[2] < needed:
            self._pointers = None
            capacity = max(needed, keys.shape[2] * 2, GROWTH)
            bigger_k = keys.new_zeros((*keys.shape[:2], capacity, keys.shape[3]))
            bigger_v = values.new_zeros((*values.shape[:2], capacity, values.shape[3]))
            bigger_k[:, :, : keys.shape[2]] = keys
            bigger_v[:, :, : values.shape[2]] = values
            self._keys[layer], self._values[layer] = bigger_k, bigger_v
        return self._keys[layer], self._values[layer]

    @property
    def capacity(self) -> int:
        """Positions each slot has room for (every slot the same: one buffer per layer)."""
        return self._keys[0].shape[2] if self._keys else 0

    def release(self, slot: int, keep_at_most: int = KEEP_AFTER_ANSWER) -> None:
        """A slot's answer ended: forget its tokens if they are more than `keep_at_most` (a long prompt is rarely
        asked again, and while any slot holds it every slot's buffer is that long), then give back the capacity no
        slot needs any more. Without this, one 6,000-token prompt kept ~1 GB of buffers for 8 slots for good."""
        if len(self.slots[slot].ids) > keep_at_most:
            self.slots[slot].ids.clear()
        needed = max(GROWTH, max(len(s.ids) for s in self.slots))
        if self.capacity > 2 * needed:
            self._pointers = None
            self._keys = [keys[:, :, :needed].clone() for keys in self._keys]  # a copy: the big buffer is freed
            self._values = [values[:, :, :needed].clone() for values in self._values]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max((len(slot.ids) for slot in self.slots), default=0)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Turn a bool "may attend" mask into the additive form eager and SDPA attention both accept."""
    zeros = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return zeros.masked_fill(~allowed, torch.finfo(dtype).min)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pass_layout(lengths: Sequence[int], feeds: Sequence[Feed], key_multiple: int = 1) -> tuple[torch.Tensor, ...]:
    """The batch of one pass: ids `[B, S]`, positions `[B, S]`, noisy `[B, S]` bool, allowed `[B, 1, S, K]` bool,
    with S the most rows any sequence feeds and K = max(L_i) + S rounded up to `key_multiple` (see the module
    docstring for the layout; a `SlotCache` returns keys up to `KEY_MULTIPLE`)."""
    s = max(feed.rows for feed in feeds)
    k = round_up(max(lengths) + s, key_multiple)
    b = len(feeds)
    ids = torch.zeros(b, s, dtype=torch.long)
    positions = torch.zeros(b, s, dtype=torch.long)
    noisy = torch.zeros(b, s, dtype=torch.bool)
    allowed = torch.zeros(b, 1, s, k, dtype=torch.bool)
    col = torch.arange(s)
    for i, (length, feed) in enumerate(zip(lengths, feeds, strict=True)):
        c, n = len(feed.clean), len(feed.noisy)
        is_clean, is_noisy = col < c, col >= s - n
        real = is_clean | is_noisy
        ids[i, :c] = torch.tensor(feed.clean, dtype=torch.long)
        # each noisy row's block: how many clean tokens it follows (-1 for clean and padding rows)
        group = torch.full((s,), -1, dtype=torch.long)
        within = torch.zeros(s, dtype=torch.long)  # a noisy row's index inside its block
        if n:
            ids[i, s - n :] = torch.tensor(feed.noisy, dtype=torch.long)
            after = torch.tensor(feed.after or (c,) * n, dtype=torch.long)
            group[s - n :] = after
            within[s - n :] = torch.arange(n) - torch.searchsorted(after, after)  # minus where its block starts
        positions[i] = torch.where(is_noisy, length + group + within, length + col)
        noisy[i] = is_noisy
        sees_clean = is_clean[None, :] & (col[None, :] < group[:, None])  # the clean tokens the row's block follows
        new = (is_clean[:, None] & is_clean[None, :] & (col[:, None] >= col[None, :])) | (
            is_noisy[:, None] & (sees_clean | (group[:, None] == group[None, :]))
        )
        new |= torch.eye(s, dtype=torch.bool) & ~real[:, None]  # padding rows see themselves only
        allowed[i, 0, :, :length] = real[:, None]
        allowed[i, 0, :, length : length + s] = new
    return ids, positions, noisy, allowed


@dataclass(frozen=True, slots=True)
class PassRows:
    """The rows of one pass as the decode kernel takes them (model/runtime/kernels/decode_layer.c), every answer's in
    one list and no padding: each answer's clean rows first, then the noisy rows whose logits decide tokens (a block's
    canvas), then the drafting mask rows (`Feed.drafts`). Row r is answer `slots[r]`'s, written at `writes[r]` of its
    slot, and attends its slot's first K keys as `bias[r]` allows (the same rows, positions and mask as `pass_layout`
    gives them)."""

    ids: torch.Tensor  # [R]
    positions: torch.Tensor  # [R] rotary positions
    slots: torch.Tensor  # [R] int64
    writes: torch.Tensor  # [R] int64
    bias: torch.Tensor  # [R, K] additive fp32
    start: int  # the first noisy row (the LoRA's)
    coarse: int  # the first drafting row
    answers: tuple[tuple[slice, slice], ...]  # per feed: its clean rows, its noisy rows

    @staticmethod
    def of(slots: Sequence[int], lengths: Sequence[int], feeds: Sequence[Feed], key_multiple: int) -> PassRows:
        """Built row by row, not gathered from `pass_layout`'s `[B, 1, S, K]` mask: every decoding step makes one,
        and the gather's ~30 small torch operations (~0.27 ms) ran while the pass's other threads waited. A row sees
        a prefix of the keys (the cache, then the clean rows up to its own, or the clean tokens its block follows)
        and, if noisy, its own block's columns."""
        s = max(feed.rows for feed in feeds)
        k = round_up(max(lengths) + s, key_multiple)
        sections: tuple[list[tuple[int, ...]], ...] = ([], [], [])  # clean, deciding, drafting rows
        spans: list[list[slice]] = [[] for _ in feeds]
        for i, (length, feed) in enumerate(zip(lengths, feeds, strict=True)):
            c, n = len(feed.clean), len(feed.noisy)
            # (feed, id, position, write, keys seen from 0, block's first key, block's end)
            sections[0].extend((i, t, length + col, length + col, length + col + 1, 0, 0)
                               for col, t in enumerate(feed.clean))
            after = feed.after or (c,) * n
            first = {g: after.index(g) for g in set(after)}
            block_end = {g: n - after[::-1].index(g) for g in set(after)}
            column = length + s - n  # where noisy row 0's key is written
            sections[2 if feed.drafts else 1].extend(
                (i, t, length + g + idx - first[g], column + idx, length + g, column + first[g], column + block_end[g])
                for idx, (t, g) in enumerate(zip(feed.noisy, after, strict=True))
            )
        taken = 0  # each answer's clean rows, then its noisy ones (deciding or drafting), as the sections hold them
        for section in range(3):
            for i, feed in enumerate(feeds):
                if section == 0 or (section == 2) == feed.drafts:
                    count = len(feed.clean) if section == 0 else len(feed.noisy)
                    spans[i].append(slice(taken, taken + count))
                    taken += count
        ordered = [*sections[0], *sections[1], *sections[2]]
        bias = np.full((len(ordered), k), np.finfo(np.float32).min, dtype=np.float32)
        for r, (_, _, _, _, seen, block, end) in enumerate(ordered):
            bias[r, :seen] = 0.0
            bias[r, block:end] = 0.0
        feed_of = [row[0] for row in ordered]
        return PassRows(
            torch.tensor([row[1] for row in ordered], dtype=torch.long),
            torch.tensor([row[2] for row in ordered], dtype=torch.long),
            torch.tensor([slots[i] for i in feed_of], dtype=torch.long),
            torch.tensor([row[3] for row in ordered], dtype=torch.long),
            torch.from_numpy(bias),
            len(sections[0]),
            len(sections[0]) + len(sections[1]),
            tuple((spans[i][0], spans[i][1]) for i in range(len(feeds))),
        )


@runtime_checkable
class PassesRows(Protocol):
    """A model pass that takes `PassRows`: every answer of a pass in the same kernel calls (model/runtime/fast_pass.py
    on a CPU with the decode kernel)."""

    def takes_rows(self) -> bool: ...

    def rows_pass(self, rows: PassRows, cache: SlotCache, keep: torch.Tensor | None = None) -> torch.Tensor: ...


@runtime_checkable
class TapsRows(Protocol):
    """A `PassesRows` that also hands out the residual rows after given layers (`FastPass.tapped_rows`)."""

    def tapped_rows(
        self, rows: PassRows, cache: SlotCache, taps: Sequence[int]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]: ...

    def logits(self, h: torch.Tensor, coarse: int | None) -> torch.Tensor: ...


def rows_pass_of(model: torch.nn.Module) -> PassesRows | None:
    """The model's pass when it takes `PassRows` (every answer of a pass in the decode kernel's calls), else None."""
    fast = model.inference_pass()
    return fast if isinstance(fast, PassesRows) and fast.takes_rows() else None


def _forward(
    model: torch.nn.Module,
    cache: SlotCache,
    layout: tuple[torch.Tensor, ...],
    logits_to_keep: torch.Tensor | None = None,
    exact_rows: int | None = None,
    prefill: bool = False,
) -> torch.Tensor:
    """The model's inference pass over a host-side `pass_layout` (logits for the `logits_to_keep` rows): its inputs
    uploaded without a host sync (`model.device.upload`), and where the adapter runs found on the host
    (`noisy_suffix`), so nothing in the pass waits for the device. Logits stay on the model's device."""
    ids, positions, noisy, allowed = layout
    device = model.base.device
    suffix = noisy_suffix(noisy)
    if suffix is not None and suffix[1] is not None:
        suffix = (suffix[0], upload(suffix[1], device))
    rows = 0 if logits_to_keep is None else upload(logits_to_keep, device)
    return model.inference_pass()(
        upload(ids, device), upload(positions, device), additive_mask(upload(allowed, device)),
        upload(noisy, device), cache, rows, exact_rows=exact_rows, suffix=suffix, prefill=prefill,
    )


@torch.inference_mode()
def batched_pass(
    model: torch.nn.Module, cache: SlotCache, slots: Sequence[int], feeds: Sequence[Feed]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One forward over every sequence's feed; returns each one's (clean logits `[len(clean), V]`, noisy logits
    `[len(noisy), V]`), float32. The new keys are written after each slot's cached tokens but not kept: call `keep`."""
    return tapped_pass(model, cache, slots, feeds)[0]


@torch.inference_mode()
def tapped_pass(
    model: torch.nn.Module, cache: SlotCache, slots: Sequence[int], feeds: Sequence[Feed]
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[torch.Tensor | None]]:
    """`batched_pass`, and for each feed that asks for taps (`Feed.taps`, one set for the pass) its clean rows'
    tapped residual rows `[len(clean), taps, hidden]` fp32 (None for the others). Taps need the decode kernel."""
    lengths = [len(cache.slots[slot].ids) for slot in slots]
    cache.bind(slots, lengths)
    fast = rows_pass_of(model)
    taps = sorted({tap for feed in feeds for tap in feed.taps})
    if taps and (fast is None or not isinstance(fast, TapsRows)):
        raise ModelError("a drafter reads the model's hidden rows through the decode kernel, which does not take "
                         "this model")
    if fast is not None:
        rows = PassRows.of(slots, lengths, feeds, KEY_MULTIPLE)
        # the head only for the rows whose logits someone reads (ascending: the drafting rows among them are still
        # the last ones); each feed's rows stay contiguous among them
        wanted = None if all(feed.logits for feed in feeds) else torch.tensor(
            [r for feed, spans in zip(feeds, rows.answers, strict=True) if feed.logits
             for span in spans for r in range(span.start, span.stop)], dtype=torch.long)
        tapped: list[torch.Tensor | None] = [None] * len(feeds)
        if taps:
            assert isinstance(fast, TapsRows)
            h, layers = fast.tapped_rows(rows, cache, taps)
            stacked = torch.stack(layers, dim=1)  # [R, taps, hidden]
            tapped = [stacked[clean] if feed.taps else None
                      for feed, (clean, _) in zip(feeds, rows.answers, strict=True)]
            coarse = rows.coarse if wanted is None else int((wanted < rows.coarse).sum())
            flat = fast.logits(h if wanted is None else h[wanted].contiguous(), coarse)
        else:
            flat = fast.rows_pass(rows, cache, wanted)  # [R, V] fp32
        return _per_feed(flat, rows, feeds, wanted), tapped
    return _layout_pass(model, cache, lengths, feeds), [None] * len(feeds)


def _per_feed(
    flat: torch.Tensor, rows: PassRows, feeds: Sequence[Feed], wanted: torch.Tensor | None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each feed's (clean, noisy) logits out of a pass's `flat` ones (of the `wanted` rows, None: every row)."""
    if wanted is None:
        return [(flat[clean], flat[noisy]) for clean, noisy in rows.answers]
    at = {r: j for j, r in enumerate(wanted.tolist())}

    def kept(span: slice) -> torch.Tensor:
        first = at.get(span.start, 0)
        return flat[first : first + span.stop - span.start]

    return [(kept(clean), kept(noisy)) if feed.logits else (flat[:0], flat[:0])
            for feed, (clean, noisy) in zip(feeds, rows.answers, strict=True)]


def _layout_pass(
    model: torch.nn.Module, cache: SlotCache, lengths: list[int], feeds: Sequence[Feed]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A pass through the model's `__call__` over a padded `pass_layout` (a model the decode kernel does not take)."""
    ids, positions, noisy, allowed = pass_layout(lengths, feeds, KEY_MULTIPLE)
    # one copy back per pass, of every sequence's logits: the decoding decisions are made on the host
    logits = _forward(model, cache, (ids, positions, noisy, allowed)).float().cpu()  # [B, S, V]
    s = ids.shape[1]
    return [
        (logits[i, : len(feed.clean)], logits[i, s - len(feed.noisy) :]) for i, feed in enumerate(feeds)
    ]


def keep(cache: SlotCache, slot: int, feed: Feed, count: int) -> None:
    """Keep the first `count` clean tokens of `slot`'s last pass in its cache; the rest is overwritten next pass."""
    cache.slots[slot].ids.extend(feed.clean[:count])


@runtime_checkable
class SizesPrefills(Protocol):
    """A model that says how many rows a prefill of `rows` tokens should be padded to."""

    def prefill_size(self, rows: int) -> int: ...


def prefill_bucket(n: int) -> int:
    """The smallest of 32, 48, 64, 96, 128, 192, ... (powers of two and 1.5 times them) holding `n` tokens."""
    size = MIN_PREFILL_BUCKET
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@torch.inference_mode()
def prefill(
    model: torch.nn.Module,
    cache: SlotCache,
    slot: int,
    tokens: Sequence[int],
    reuse: bool = True,
    cancel: threading.Event | None = None,
) -> tuple[int, torch.Tensor | None]:
    """Make `slot` hold exactly `tokens`, encoding only what its cache does not share with them (a conversation's next
    prompt starts with the last one). Returns (tokens reused, logits `[V]` predicting the token after `tokens`, or None
    when nothing was encoded).

    Each forward is padded (with the last token) up to a `prefill_bucket` size, the padding left beyond the slot's
    length: exact, because prompt positions attend only backwards. Its rows are attended together (`exact_rows=0`): a
prompt is encoded the same way whichever decoding mode then answers it. Why: a bf16 matmul on the CPU builds and keeps a
    oneDNN kernel for every new input shape, so prefilling every turn's prompt at its own length grew a server's memory
    by megabytes a turn. Prompts beyond `PREFILL_CHUNK` go in chunks, and `cancel` is checked before each, so a long
    prompt does not hold the model after its answer was cancelled (`GenerationCancelled`; the slot then holds only
    the chunks encoded so far).
    """
    held = cache.slots[slot].ids
    start = common_prefix(held, tokens) if reuse else 0
    del held[start:]
    logits = None
    for lo in range(start, len(tokens), PREFILL_CHUNK):
        if cancel is not None and cancel.is_set():
            raise GenerationCancelled("cancelled while encoding the prompt")
        part = list(tokens[lo : lo + PREFILL_CHUNK])
        # a pass that compiles no kernel per shape (the decode kernel) takes the prompt as it is
        size = model.prefill_size(len(part)) if isinstance(model, SizesPrefills) else prefill_bucket(len(part))
        padded = Feed(clean=tuple(part + [part[-1]] * (size - len(part))))
        layout = pass_layout([lo], [padded], KEY_MULTIPLE)
        cache.bind([slot], [lo])
        keep_last = torch.tensor([len(part) - 1])
        logits = _forward(model, cache, layout, keep_last, exact_rows=0, prefill=True)[0, -1].float()
        held.extend(part)
    return start, logits
