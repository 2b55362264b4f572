"""The generated haproxy.cfg is one HAProxy itself accepts, with the settings the cluster relies on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scripts.report_lib.haproxy import Backend, BalancerConfig, haproxy_binary, haproxy_config

pytestmark = pytest.mark.timeout(60)


def test_haproxy_accepts_the_config_and_it_balances_by_least_connections_checked_on_readyz(tmp_path: Path) -> None:
    workers = [Backend("worker0", "127.0.0.1", 18001), Backend("worker1", "127.0.0.1", 18002)]
    text = haproxy_config(workers, BalancerConfig(bind_port=18000, max_sessions_per_client=5))
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    binary = haproxy_binary()
    assert binary is not None, "haproxy is not installed (Makefile APT_PACKAGES)"
    check = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "balance leastconn" in text and "option httpchk GET /readyz" in text
    assert "server worker0 127.0.0.1:18001 check" in text and "server worker1 127.0.0.1:18002 check" in text
    assert "retry-on conn-failure empty-response 503" in text  # a handshake refused by a draining worker moves on
    assert "sc_conn_cur(0) gt 5" in text


def test_no_worker_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        haproxy_config([], BalancerConfig())
