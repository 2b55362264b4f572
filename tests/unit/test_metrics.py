"""The worker's Prometheus metrics as a fold over session events, and reading quantiles back from a scrape."""

from __future__ import annotations

import json
import math

import pytest

from voice import events as ev
from web.metrics import LATENCY_BUCKETS, VoiceMetrics, bucket_index, histogram_buckets, histogram_quantile
from web.protocol import encode_event


def turn_end(turn: int, voice_to_voice_ms: float, hits: float = 2.0, misses: float = 1.0) -> ev.TurnEnd:
    latency = {"asr_final": 200.0, "lm_first_pass": 100.0, "voice_to_voice": voice_to_voice_ms}
    stats = {"hits": hits, "misses": misses, "tokens": 20.0, "passes": 10.0, "lm_seconds": 1.0}
    return ev.TurnEnd(session="s", turn=turn, user_text="hi", answer="hello", spoken="hello", interrupted=False,
                      latency_ms=latency, stats=stats)


def test_turn_ends_and_errors_fold_into_counters_and_histograms() -> None:
    metrics = VoiceMetrics()
    for turn, ms in enumerate((300.0, 700.0, 1900.0)):
        metrics.observe(turn_end(turn, ms))
    metrics.observe(ev.ErrorEvent(session="s", turn=3, code="model_error", message="the LM is down"))
    metrics.observe(ev.SpeechStart(session="s", turn=4))  # not a metric: ignored
    text = metrics.render().decode()

    assert 'voice_turns_total{interrupted="false"} 3.0' in text
    assert 'voice_errors_total{code="model_error"} 1.0' in text
    assert 'voice_speculative_phrases_total{result="hit"} 6.0' in text
    assert 'voice_speculative_phrases_total{result="miss"} 3.0' in text
    assert "voice_lm_tokens_total 60.0" in text and "voice_lm_seconds_total 3.0" in text
    assert "voice_to_voice_seconds_count 3.0" in text
    assert 'voice_stage_seconds_count{stage="asr_final"} 3.0' in text
    buckets = histogram_buckets(text, "voice_to_voice_seconds")
    assert dict(buckets)[0.7] == 2 and dict(buckets)[2.0] == 3 and buckets[-1] == (math.inf, 3)
    assert histogram_buckets(text, "voice_stage_seconds", {"stage": "lm_first_pass"})[-1][1] == 3


def test_a_turn_is_counted_at_the_figure_its_client_was_sent() -> None:
    # a turn held the 1.5 s hold ends a few microseconds past it; its client reads 1500.0 ms in turn_end, and a
    # dashboard's bucket must be the one that figure falls in (the cluster test's check of the load test's samples)
    metrics = VoiceMetrics()
    held = turn_end(0, 1500.04)
    metrics.observe(held)
    sent = json.loads(encode_event(held))["latency_ms"]["voice_to_voice"]
    buckets = dict(histogram_buckets(metrics.render().decode(), "voice_to_voice_seconds"))
    assert sent == 1500.0 and buckets[1.5] == 1 and bucket_index(sent / 1000) == LATENCY_BUCKETS.index(1.5)


def test_two_servers_do_not_share_metrics() -> None:
    first, second = VoiceMetrics(), VoiceMetrics()
    first.observe(turn_end(0, 500.0))
    assert "voice_to_voice_seconds_count 0.0" in second.render().decode()


def test_quantile_interpolates_inside_its_bucket_as_promql_does() -> None:
    buckets = [(0.5, 0.0), (1.0, 10.0), (2.0, 20.0), (math.inf, 20.0)]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(1.0)
    assert histogram_quantile(buckets, 0.25) == pytest.approx(0.75)
    assert histogram_quantile(buckets, 0.95) == pytest.approx(1.9)
    assert math.isnan(histogram_quantile([(1.0, 0.0), (math.inf, 0.0)], 0.5))


def test_bucket_index() -> None:
    assert bucket_index(0.01) == 0
    assert bucket_index(0.5) == LATENCY_BUCKETS.index(0.5)
    assert bucket_index(0.51) == LATENCY_BUCKETS.index(0.6)
    assert bucket_index(99.0) == len(LATENCY_BUCKETS)
