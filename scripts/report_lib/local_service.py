"""A service on loopback, as the benches, reports and tests start one: a free port, and waiting for `/readyz`.

One home for what each of them wrote again: a port the kernel hands out, and a wait that polls a URL until it answers
200, gives up on a deadline, and stops early when the process it waits for has exited (a bad flag, a missing model)
instead of polling a dead port until the deadline.
"""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


class NotReady(RuntimeError):
    """The service exited while starting, or did not answer 200 in time."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's choice)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_ready(url: str, limit_s: float, process: subprocess.Popen[bytes] | None = None, poll_s: float = 0.3) -> None:
    """Return once `url` answers 200; raise NotReady if `process` exits first or `limit_s` passes (the process, if
    given, is killed then)."""
    deadline = time.monotonic() + limit_s
    with httpx.Client(timeout=2) as http:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise NotReady(f"{' '.join(map(str, process.args[:4]))} exited with code {process.returncode}")
            try:
                if http.get(url).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(poll_s)
    if process is not None:
        process.kill()
    raise NotReady(f"{url} was not ready within {limit_s:g} s")
