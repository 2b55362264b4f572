"""A cluster on loopback: one `dlm-serve` (the shared LM service), N `voice-assistant serve` workers using it through
`--llm-url`, and HAProxy in front of them (scripts/report_lib/haproxy.py). For scripts/cluster.py and its test.

Every process is a real child process on 127.0.0.1 with its own log; `stop` ends them gracefully (SIGTERM: the
workers drain) and kills what does not exit in time. A worker can be killed on purpose (a fault) or drained.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from scripts.report_lib.haproxy import Backend, BalancerConfig, haproxy_binary, haproxy_config
from scripts.report_lib.load import LoadTestError, SpawnedServer
from scripts.report_lib.local_service import NotReady, free_port, wait_ready
from voice.engines import default_lm_threads

LM_NAME = "voice-lm"
START_TIMEOUT_S = 180.0


@dataclass(slots=True)
class Cluster:
    folder: Path  # config and logs
    workers: int = 2
    max_sessions: int = 8
    max_new_tokens: int | None = None
    # The LM service shares this machine's cores with the workers' Whisper and Piper: give it the thread count a
    # voice process gives its own LM (voice.engines.default_lm_threads), or its OpenMP team of every core stalls at
    # each barrier while a worker holds one of them. On its own machine dlm-serve keeps torch's default.
    lm_threads: int = field(default_factory=default_lm_threads)
    lm_port: int = 0
    balancer_port: int = 0
    lm: subprocess.Popen[bytes] | None = None
    voice: list[SpawnedServer] = field(default_factory=list)
    balancer: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.balancer_port}/ws"

    @property
    def lm_url(self) -> str:
        return f"http://127.0.0.1:{self.lm_port}"

    def worker_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.voice[index].port}"

    async def start(self) -> None:
        if haproxy_binary() is None:
            raise LoadTestError("haproxy is not installed (Debian package haproxy; `make install` installs it)")
        self.folder.mkdir(parents=True, exist_ok=True)
        await self.start_lm()
        extra = ["--llm-url", f"{self.lm_url}/v1", "--llm-model", LM_NAME]
        extra += ["--max-new-tokens", str(self.max_new_tokens)] if self.max_new_tokens else []
        self.voice = [SpawnedServer(extra_args=extra, max_sessions=self.max_sessions) for _ in range(self.workers)]
        await asyncio.gather(*(w.start(self.folder / f"worker{i}.log") for i, w in enumerate(self.voice)))
        for index in range(self.workers):
            await _until_ready(f"{self.worker_url(index)}/readyz")
        self.balancer_port = free_port()
        backends = [Backend(f"worker{i}", "127.0.0.1", w.port) for i, w in enumerate(self.voice)]
        # every test client shares one address: the per-address limit must not be what a load test measures
        balancer = BalancerConfig(bind_port=self.balancer_port, max_sessions_per_client=self.max_sessions * 4)
        config = self.folder / "haproxy.cfg"
        config.write_text(haproxy_config(backends, balancer))
        _check_haproxy_config(config)
        self.balancer = _launch([_haproxy(), "-db", "-f", str(config)], self.folder / "haproxy.log")
        await _until_ready(f"http://127.0.0.1:{self.balancer_port}/readyz")
        # both workers seen up by the balancer's own checks (rise 2 at 500 ms)
        await asyncio.sleep(1.5)

    async def start_lm(self) -> None:
        """(Re)start the LM service, on the same port once it has one."""
        self.lm_port = self.lm_port or free_port()
        command = [sys.executable, "-m", "model.server.cli", "--port", str(self.lm_port), "--served-name", LM_NAME,
                   "--log-level", "warning"]
        self.lm = _launch(command, self.folder / "lm.log", {"OMP_NUM_THREADS": str(self.lm_threads)})
        await _until_ready(f"{self.lm_url}/readyz", self.lm)

    def kill_lm(self) -> None:
        if self.lm is not None:
            self.lm.kill()
            self.lm.wait()

    def kill_worker(self, index: int) -> None:
        """SIGKILL: a crash, no drain."""
        process = self.voice[index].process
        if process is not None:
            process.kill()
            process.wait()

    def drain_worker(self, index: int) -> None:
        """SIGTERM: the worker drains and exits (web.server.VoiceServer.drain)."""
        process = self.voice[index].process
        if process is not None:
            process.send_signal(signal.SIGTERM)

    async def stop(self) -> None:
        if self.balancer is not None and self.balancer.poll() is None:
            self.balancer.terminate()
            await asyncio.to_thread(self.balancer.wait, 10)
        await asyncio.gather(*(w.stop() for w in self.voice))
        if self.lm is not None and self.lm.poll() is None:
            self.lm.terminate()
            try:
                await asyncio.to_thread(self.lm.wait, 20)
            except subprocess.TimeoutExpired:
                self.kill_lm()

    async def __aenter__(self) -> Cluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def _launch(command: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A child process whose output is appended to `log_path` (a restarted service keeps its earlier log)."""
    with log_path.open("ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def _check_haproxy_config(config: Path) -> None:
    check = subprocess.run([_haproxy(), "-c", "-f", str(config)], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise LoadTestError(f"haproxy refused its config: {check.stdout}{check.stderr}")


async def scrape(url: str) -> str:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(url)
        response.raise_for_status()
        return response.text


async def _until_ready(url: str, process: subprocess.Popen[bytes] | None = None) -> None:
    try:
        await asyncio.to_thread(wait_ready, url, START_TIMEOUT_S, process)
    except NotReady as exc:
        raise LoadTestError(str(exc)) from None


def _haproxy() -> str:
    binary = haproxy_binary()
    if binary is None:
        raise LoadTestError("haproxy is not installed (Debian package haproxy; `make install` installs it)")
    return binary
