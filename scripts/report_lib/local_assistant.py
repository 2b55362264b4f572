"""`voice-assistant` in local mode as a child process on the virtual devices (see `pulse_devices`), with its console
lines timestamped, for the local-mode test and benchmark."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from scripts.report_lib.pulse_devices import VirtualDevices

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0  # three models on a busy 2-core machine
# The summary line local mode prints at the end of every turn
TURN_SUMMARY = re.compile(
    r"\[(?:voice-to-voice (?P<v2v>\d+) ms, )?underruns (?P<underruns>\d+)(?: \((?P<audible>\d+) while speaking)?"
)


class AssistantFailed(RuntimeError):
    """The assistant did not print what was expected in time; the message holds its console."""


class LocalAssistant:
    """`python -m web.cli ARGS` on the virtual devices, with `env` added to theirs (`OLLAMA_MODELS`); `lines` holds
    (monotonic time, line) of its console."""

    def __init__(self, devices: VirtualDevices, args: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        path = os.pathsep.join(filter(None, [str(ROOT), devices.env.get("PYTHONPATH", "")]))
        env = {**devices.env, **(env or {}), "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen([sys.executable, "-m", "web.cli", *args], cwd=ROOT, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, name="assistant-console", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def wait_line(self, pattern: str | re.Pattern[str], timeout_s: float, after: int = 0) -> re.Match[str]:
        """The first console line from index `after` on that matches `pattern`."""
        deadline = time.monotonic() + timeout_s
        while True:
            for _, line in self.lines[after:]:
                if match := re.search(pattern, line):
                    return match
            if time.monotonic() > deadline or (self.process.poll() is not None and not self._reader.is_alive()):
                raise AssistantFailed(f"no line matching {pattern!r} within {timeout_s:g} s; console:\n"
                                      f"{self.output()}")  # fmt: skip
            time.sleep(0.05)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        self.wait_line(r"^listening\.\.\.", timeout_s)

    def stop(self, signum: int = signal.SIGINT, timeout_s: float = 10.0) -> tuple[int, float]:
        """Send `signum`; the exit code and the seconds it took to exit."""
        sent = time.monotonic()
        self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            self.kill()
            raise AssistantFailed(f"still running {timeout_s:g} s after signal {signum}; console:\n"
                                  f"{self.output()}") from err  # fmt: skip
        return code, time.monotonic() - sent

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
