"""Prometheus metrics of a voice worker, folded from the same session events the latency report reads.

Each `VoiceServer` owns one `VoiceMetrics` with its own registry (not prometheus-client's global one), so two servers
in one test process never share counters. `observe(event)` is the whole fold: no I/O, no clock, so a test drives it
with a list of events. The text format is rendered on `GET /metrics` by web/server.py.

Names follow Prometheus conventions: a `voice_` prefix, base units (seconds), `_total` for counters, and labels only
of small closed sets (a stage name, a hit or a miss, an error code).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from voice import events as ev
from voice.latency import STAGE_NAMES
from web.protocol import latency_on_wire

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Voice-to-voice and its stages on two cores span ~30 ms (a speculative TTS hit) to several seconds (a held turn
# under load); buckets finer where the goals are (0.5 s, 0.8 s, 2 s), so a p50 read from them lands within 100 ms.
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0,
                   10.0)


class VoiceMetrics:
    """The worker's counters, gauges and histograms; `observe` each session event, `render` for a scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sessions_open = Gauge("voice_sessions_open", "WebSocket voice sessions open now", registry=r)
        self.sessions_max = Gauge("voice_sessions_max", "Sessions this worker accepts at most", registry=r)
        self.draining = Gauge("voice_draining", "1 while the worker drains (refuses new sessions)", registry=r)
        self.sessions = Counter("voice_sessions", "Voice sessions opened", registry=r)
        self.refused = Counter("voice_sessions_refused", "Sessions refused", ["reason"], registry=r)
        self.turns = Counter("voice_turns", "Turns ended", ["interrupted"], registry=r)
        self.voice_to_voice = Histogram(
            "voice_to_voice_seconds", "First assistant audio out minus the user's speech end",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.stage = Histogram(
            "voice_stage_seconds", "Each stage's share of the critical path (they add up to voice-to-voice)",
            ["stage"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.phrases = Counter(
            "voice_speculative_phrases", "Phrases by speculative TTS outcome (hit: rendered early and released)",
            ["result"], registry=r,
        )
        self.lm_tokens = Counter("voice_lm_tokens", "Answer tokens the language model generated", registry=r)
        self.lm_passes = Counter("voice_lm_passes", "Language-model refinement passes of answers", registry=r)
        self.lm_seconds = Counter(
            "voice_lm_seconds", "Time the language model spent on answers (tokens/s = rate of tokens / this)",
            registry=r,
        )
        self.errors = Counter("voice_errors", "Error events sent to clients", ["code"], registry=r)

    def observe(self, event: ev.Event) -> None:
        """Fold one session event into the metrics."""
        match event:
            case ev.TurnEnd(interrupted=interrupted, latency_ms=exact, stats=stats):
                self.turns.labels(interrupted=str(interrupted).lower()).inc()
                latency = latency_on_wire(exact)  # the figures the turn's client was sent, bucketed as it would
                if latency.get("voice_to_voice") is not None:
                    self.voice_to_voice.observe(latency["voice_to_voice"] / 1000)
                for stage in STAGE_NAMES:
                    if latency.get(stage) is not None:
                        self.stage.labels(stage=stage).observe(latency[stage] / 1000)
                self.phrases.labels(result="hit").inc(stats.get("hits", 0.0))
                self.phrases.labels(result="miss").inc(stats.get("misses", 0.0))
                self.lm_tokens.inc(stats.get("tokens", 0.0))
                self.lm_passes.inc(stats.get("passes", 0.0))
                self.lm_seconds.inc(stats.get("lm_seconds", 0.0))
            case ev.ErrorEvent(code=code):
                self.errors.labels(code=code).inc()
            case _:
                pass

    def error_sent(self, code: str) -> None:
        """An error the server itself sent (a refused frame, a limit), not one of the session's events."""
        self.errors.labels(code=code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def histogram_buckets(text: str, name: str, labels: dict[str, str] | None = None) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of histogram `name` in a scrape's text, for the series with `labels`."""
    wanted = labels or {}
    buckets = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != f"{name}_bucket":
                continue
            if any(sample.labels.get(k) != v for k, v in wanted.items()):
                continue
            buckets.append((float(sample.labels["le"]), sample.value))
    return sorted(buckets)


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """The q-quantile of cumulative buckets, interpolated linearly inside its bucket, as PromQL's
    `histogram_quantile` does (NaN without observations)."""
    if not buckets or buckets[-1][1] == 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def bucket_index(value: float, bounds: Sequence[float] = LATENCY_BUCKETS) -> int:
    """Which bucket `value` falls in (0 for the first; len(bounds) for +Inf): "within one bucket" is |Δindex| <= 1."""
    return next((i for i, bound in enumerate(bounds) if value <= bound), len(bounds))
