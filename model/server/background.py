"""Run the API with uvicorn on a loopback port in a background thread: for tests, benchmarks and embedding."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

from model.chat import ChatModel
from model.server.app import create_app
from model.server.config import ServerConfig
from model.server.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class RunningServer:
    base_url: str  # e.g. http://127.0.0.1:PORT (append /v1 for the openai client)
    scheduler: Scheduler

    @property
    def api_url(self) -> str:
        return f"{self.base_url}/v1"

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Block until no generation is queued or running (the scheduler's counters are then final)."""
        deadline = time.monotonic() + timeout_s
        while self.scheduler.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.scheduler.pending:
            raise TimeoutError(f"{self.scheduler.pending} generations still pending after {timeout_s} s")


@contextmanager
def serve_in_thread(
    model: ChatModel, config: ServerConfig, graceful_timeout_s: float = 5.0, startup_timeout_s: float = 30.0
) -> Iterator[RunningServer]:
    """uvicorn on 127.0.0.1 and a free port; stopped gracefully (as on SIGTERM) when the block exits: running
    requests get `graceful_timeout_s` to finish, then they are cancelled and the scheduler is closed."""
    app = create_app(model, config)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=graceful_timeout_s,
                       lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="dlm-serve-background", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield RunningServer(base_url=f"http://127.0.0.1:{port}", scheduler=app.state.scheduler)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
