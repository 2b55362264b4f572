"""Prometheus metrics of `dlm-serve`: the queue an operator watches and what each pass costs.

The scheduler's own counters (`SchedulerStats`) are read at scrape time by a collector, so nothing is counted twice;
per-pass figures are observed as the drafts pass through the scheduler's worker threads (prometheus-client's metrics
are thread-safe). Every app has its own registry, so two servers in one test process never share counters.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from model.chat import Draft
from model.server.scheduler import Scheduler

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# a pass on two cores: ~25 ms (one token, one thread) to a few hundred ms (a full batch beside Whisper)
PASS_BUCKETS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)


class _SchedulerCollector(Collector):
    """The scheduler's queue and outcome counters, as they are at the moment of the scrape."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self.scheduler.stats
        yield GaugeMetricFamily("dlm_queue_depth", "Generations queued or running", value=self.scheduler.pending)
        yield GaugeMetricFamily("dlm_generations_running", "Generations decoding now (sharing each pass)",
                                value=self.scheduler.running)
        outcomes = CounterMetricFamily("dlm_generations", "Generations by outcome", labels=["outcome"])
        counts = {"completed": stats.completed, "cancelled": stats.cancelled, "refused": stats.refused,
                  "failed": stats.failed, "rejected": stats.rejected}
        for outcome, count in counts.items():
            outcomes.add_metric([outcome], count)
        yield outcomes


class ApiMetrics:
    """Metrics of one API app; `observe_draft` is called for every pass of every generation."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.pass_seconds = Histogram("dlm_pass_seconds", "Wall time of one refinement pass, as one answer saw it",
                                      buckets=PASS_BUCKETS, registry=r)
        self.tokens = Counter("dlm_completion_tokens", "Answer tokens generated", registry=r)
        self.decode_seconds = Counter(
            "dlm_decode_seconds", "Pass time summed over answers (tokens/s = rate of tokens / this)", registry=r
        )
        self.errors = Counter("dlm_errors", "Errors answered to clients", ["code"], registry=r)

    def watch(self, scheduler: Scheduler) -> None:
        """Report `scheduler`'s queue and outcomes (it takes `observe_draft` as its hook, so it comes second)."""
        self.registry.register(_SchedulerCollector(scheduler))

    def observe_draft(self, draft: Draft) -> None:
        self.pass_seconds.observe(draft.elapsed_s)
        self.decode_seconds.inc(draft.elapsed_s)
        if draft.done:
            self.tokens.inc(draft.completion_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
