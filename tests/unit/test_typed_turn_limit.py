"""The per-connection limit on typed turns (WebConfig.typed_turn_limit), driven by a fake clock: a burst, then one
turn per interval; refusals are never a reason to close, and each says when the next turn will be accepted."""

from __future__ import annotations

import math

import pytest

from web.config import WebConfig, WebConfigError
from web.ratelimit import TokenBucket, Verdict


def test_a_burst_of_typed_turns_then_one_per_interval() -> None:
    config = WebConfig(typed_turn_burst=3, typed_turn_interval_s=2.0)
    bucket = TokenBucket(config.typed_turn_limit, now=0.0)
    assert [bucket.take(1.0, now=0.0).verdict for _ in range(3)] == [Verdict.ACCEPT] * 3
    refused = bucket.take(1.0, now=0.0)
    assert refused.verdict is Verdict.DROP and refused.notify  # every refusal is told, not one per second
    assert bucket.wait_s(1.0, now=0.5) == pytest.approx(1.5)
    assert bucket.take(1.0, now=1.9).verdict is Verdict.DROP
    assert bucket.take(1.0, now=2.0).verdict is Verdict.ACCEPT
    assert bucket.wait_s(1.0, now=2.0) == pytest.approx(2.0)
    assert bucket.take(1.0, now=3.0).verdict is Verdict.DROP
    assert bucket.take(1.0, now=4.0).verdict is Verdict.ACCEPT


def test_refused_typed_turns_never_close_the_connection_and_cost_nothing() -> None:
    bucket = TokenBucket(WebConfig(typed_turn_burst=1, typed_turn_interval_s=2.0).typed_turn_limit, now=0.0)
    assert bucket.take(1.0, now=0.0).verdict is Verdict.ACCEPT
    decisions = [bucket.take(1.0, now=i * 0.001) for i in range(10_000)]  # a turn every millisecond for 10 s
    assert {d.verdict for d in decisions[:1999]} == {Verdict.DROP}
    assert all(d.notify for d in decisions if d.verdict is Verdict.DROP)
    # refusals take no tokens: the next turn is due one interval after the last accepted one, not after the spam
    assert decisions[2000].verdict is Verdict.ACCEPT


def test_a_person_typing_never_reaches_the_default_limit() -> None:
    bucket = TokenBucket(WebConfig().typed_turn_limit, now=0.0)
    # five quick one-word replies, then an hour of a turn every 2.5 s (faster than anyone types and reads answers)
    times = [0.0, 0.4, 0.8, 1.2, 1.6] + [2.0 + 2.5 * i for i in range(1440)]
    assert {bucket.take(1.0, now=t).verdict for t in times} == {Verdict.ACCEPT}


def test_wait_is_zero_when_a_turn_would_pass_and_infinite_when_none_ever_could() -> None:
    bucket = TokenBucket(WebConfig().typed_turn_limit, now=0.0)
    assert bucket.wait_s(1.0, now=0.0) == 0.0
    assert math.isinf(bucket.wait_s(bucket.limit.burst + 1, now=0.0))


def test_a_limit_that_refuses_every_typed_turn_is_a_config_error() -> None:
    with pytest.raises(WebConfigError, match="typed_turn_burst"):
        WebConfig(typed_turn_burst=0.5)
    with pytest.raises(WebConfigError, match="typed_turn_interval_s"):
        WebConfig(typed_turn_interval_s=0.0)
