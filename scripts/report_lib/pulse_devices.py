"""Virtual audio devices for local mode: a private PulseAudio server with a speaker and a microphone that a test drives.

    with VirtualDevices.start(folder) as devices:       # pulseaudio -n with only what we load, its own runtime dir
        devices.env                                     # give this to `voice-assistant`: PortAudio's ALSA sees pulse
        devices.mic.say(pcm16_16k)                      # real speech into the pipe source `mic`, in real time
        devices.speaker.first_voice_after(t)            # what reached the null sink `spk` (recorded from its monitor)

The server is user-mode (`--daemonize=no`, no autospawn, no D-Bus), so it works as root in CI; pulseaudio only warns
about root. ALSA is routed to it by an extra ALSA config file named in `ALSA_CONFIG_PATH` (`pcm.!default` of type
`pulse`, from libasound2-plugins) and `PULSE_SERVER`, so nothing outside the temporary folder changes and a user's own
sound server is never touched. Both sides keep monotonic timestamps: the microphone when each clip's last sample went
into the pipe, the speaker recorder the time of every recorded sample, so latency is measured as a listener hears it.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import glob
import os
import shutil
import subprocess
import termios
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MIC_RATE = 16_000
SPEAKER_RATE = 16_000  # the monitor is recorded at 16 kHz mono: plenty to see where speech is
BLOCK_S = 0.02
START_TIMEOUT_S = 10.0
MAX_BACKLOG_BYTES = 3200  # 100 ms of microphone audio not yet read by the server
ALSA_PULSE_PLUGIN = "/usr/lib/*/alsa-lib/libasound_module_pcm_pulse.so"
ALSA_DEFAULT_CONFIG = "/usr/share/alsa/alsa.conf"
ROUTE_ALSA_TO_PULSE = """\
pcm.!default { type pulse hint { show on description "PulseAudio (virtual devices)" } }
ctl.!default { type pulse }
"""


class PulseUnavailable(RuntimeError):
    """PulseAudio or the ALSA pulse plugin is not installed (`make install` installs them)."""


def missing_parts() -> list[str]:
    """What this machine lacks to run the virtual devices; empty when everything is there."""
    missing = [tool for tool in ("pulseaudio", "pactl", "parec", "pacat") if shutil.which(tool) is None]
    if not glob.glob(ALSA_PULSE_PLUGIN):
        missing.append("the ALSA pulse plugin (libasound2-plugins)")
    if not Path(ALSA_DEFAULT_CONFIG).is_file():
        missing.append(ALSA_DEFAULT_CONFIG)
    return missing


class MicFeeder:
    """Writes the pipe source's FIFO at real-time pace: silence, or queued speech, 20 ms at a time, like a microphone.

    `say` returns at once; `clip_ends` holds, per clip, the monotonic time its last sample went into the pipe.
    """

    def __init__(self, fifo: Path) -> None:
        self._fifo = fifo
        self._queue: deque[np.ndarray] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.clip_ends: list[float] = []
        self._thread = threading.Thread(target=self._run, name="virtual-mic", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def say(self, pcm16: bytes) -> None:
        with self._lock:
            self._queue.append(np.frombuffer(pcm16, dtype="<i2"))

    def busy(self) -> bool:
        with self._lock:
            return bool(self._queue)

    def wait_spoken(self, count: int, timeout_s: float) -> float:
        """Wait until `count` clips have been written; the end time of the last of them."""
        deadline = time.monotonic() + timeout_s
        while len(self.clip_ends) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the virtual microphone wrote {len(self.clip_ends)} of {count} clips")
            time.sleep(0.02)
        return self.clip_ends[count - 1]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _next_block(self, frames: int, backlog: int) -> np.ndarray | None:
        """The next 20 ms to write; None for silence nobody is reading (see `_run`)."""
        block = np.zeros(frames, dtype="<i2")
        with self._lock:
            if not self._queue and backlog > MAX_BACKLOG_BYTES:
                return None
            if self._queue:
                clip = self._queue[0]
                take = min(frames, len(clip))
                block[:take] = clip[:take]
                if take == len(clip):
                    self._queue.popleft()
                    self.clip_ends.append(time.monotonic() + take / MIC_RATE)
                else:
                    self._queue[0] = clip[take:]
        return block

    def _run(self) -> None:
        # pulseaudio reads the pipe only while something records from `mic`; silence written meanwhile would queue
        # up in the FIFO (up to 2 s) and delay everything said later, so silence is skipped while audio is waiting.
        frames = int(MIC_RATE * BLOCK_S)
        waiting = array.array("i", [0])
        with self._fifo.open("wb", buffering=0) as pipe:  # pulseaudio holds the read end open
            start = time.monotonic()
            written = 0
            while not self._stop.is_set():
                fcntl.ioctl(pipe.fileno(), termios.FIONREAD, waiting)
                block = self._next_block(frames, waiting[0])
                if block is not None:
                    try:
                        pipe.write(block.tobytes())
                    except BrokenPipeError:  # the server stopped
                        return
                written += frames
                delay = start + written / MIC_RATE - time.monotonic()
                if delay > 0:
                    time.sleep(delay)


class SpeakerRecorder:
    """Records the null sink's monitor with `parec`; every sample gets a monotonic time (anchored on the least
    delayed read, so pipe and scheduling delays do not shift the timeline)."""

    def __init__(self, env: dict[str, str], device: str = "spk.monitor") -> None:
        command = [
            "parec", f"--device={device}", "--raw", "--format=s16le", f"--rate={SPEAKER_RATE}", "--channels=1",
            "--latency-msec=10", "--client-name=test-recorder",
        ]  # fmt: skip
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self._chunks: list[np.ndarray] = []
        self._samples = 0
        self._anchor = float("inf")  # monotonic time of sample 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="virtual-speaker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._process.stdout is not None
        while chunk := self._process.stdout.read1(4096):  # type: ignore[attr-defined]
            now = time.monotonic()
            samples = np.frombuffer(chunk[: len(chunk) // 2 * 2], dtype="<i2")
            with self._lock:
                self._chunks.append(samples)
                self._samples += len(samples)
                self._anchor = min(self._anchor, now - self._samples / SPEAKER_RATE)

    def stop(self) -> None:
        self._process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=2)
        self._thread.join(timeout=2)

    def audio(self) -> tuple[float, np.ndarray]:
        """(monotonic time of the first sample, every sample recorded so far as float32)."""
        with self._lock:
            joined = np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype="<i2")
            return self._anchor, joined.astype(np.float32) / 32768.0

    def voiced_spans(self, since: float, threshold: float = 0.01, window_s: float = 0.02) -> list[tuple[float, float]]:
        """(start, end) monotonic times of the stretches after `since` whose 20 ms RMS is above `threshold`; gaps
        shorter than 0.3 s (pauses between words) are bridged."""
        return _voiced_spans(*self.audio(), since, threshold, window_s)

    def first_voice_after(self, since: float, threshold: float = 0.01) -> float | None:
        spans = self.voiced_spans(since, threshold)
        return spans[0][0] if spans else None

    def sounding(self, since: float, threshold: float = 0.01, within_s: float = 0.1) -> bool:
        """Whether the speaker is voiced now: its last voiced stretch after `since` reaches the last `within_s`
        seconds of the recording (parec delivers in ~10 ms reads, so "now" is the recording's end). The spans and
        the end come from one snapshot of the recording."""
        anchor, samples = self.audio()
        spans = _voiced_spans(anchor, samples, since, threshold)
        return bool(spans) and spans[-1][1] > anchor + len(samples) / SPEAKER_RATE - within_s


def _voiced_spans(
    anchor: float, samples: np.ndarray, since: float, threshold: float, window_s: float = 0.02
) -> list[tuple[float, float]]:
    """`SpeakerRecorder.voiced_spans` of a recording whose sample 0 was at monotonic time `anchor`."""
    window = int(SPEAKER_RATE * window_s)
    first = max(0, int((since - anchor) * SPEAKER_RATE))
    usable = (len(samples) - first) // window
    if usable <= 0:
        return []
    frames = samples[first : first + usable * window].reshape(usable, window)
    loud = np.sqrt(np.mean(frames**2, axis=1)) > threshold
    spans: list[tuple[float, float]] = []
    for index in np.flatnonzero(loud):
        start = anchor + (first + index * window) / SPEAKER_RATE
        end = start + window_s
        if spans and start - spans[-1][1] < 0.3:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


@dataclass
class VirtualDevices:
    """A running private PulseAudio server with a null sink `spk` and a pipe source `mic` (both the defaults)."""

    folder: Path
    env: dict[str, str]
    server: subprocess.Popen[bytes]
    mic: MicFeeder
    speaker: SpeakerRecorder | None = None
    log_path: Path = field(default_factory=Path)

    @classmethod
    @contextlib.contextmanager
    def start(cls, folder: Path, record: bool = True):  # type: ignore[no-untyped-def]
        """Start the server, the microphone feeder and (with `record`) the speaker recorder; stop all on exit."""
        if missing := missing_parts():
            raise PulseUnavailable("missing " + ", ".join(missing) + " (`make install` installs them)")
        devices = cls._launch(folder)
        try:
            devices.mic.start()
            if record:
                devices.speaker = SpeakerRecorder(devices.env)
            yield devices
        finally:
            devices.stop()

    @classmethod
    def _launch(cls, folder: Path) -> VirtualDevices:
        folder.mkdir(parents=True, exist_ok=True)
        runtime, home = folder / "runtime", folder / "home"
        runtime.mkdir(exist_ok=True)
        home.mkdir(exist_ok=True)
        socket, fifo = runtime / "native", folder / "mic.fifo"
        alsa_conf = folder / "asound.conf"
        alsa_conf.write_text(ROUTE_ALSA_TO_PULSE)
        server_env = {**os.environ, "PULSE_RUNTIME_PATH": str(runtime), "XDG_RUNTIME_DIR": str(runtime),
                      "HOME": str(home)}  # fmt: skip
        server_env.pop("PULSE_SERVER", None)
        command = [
            "pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--use-pid-file=no", "--disallow-exit",
            "--disable-shm=yes", "--log-target=stderr", "--log-level=warning",
            f"--load=module-native-protocol-unix auth-anonymous=1 socket={socket}",
            "--load=module-null-sink sink_name=spk rate=22050 channels=1",
            f"--load=module-pipe-source source_name=mic file={fifo} format=s16le rate={MIC_RATE} channels=1",
        ]  # fmt: skip
        log_path = folder / "pulseaudio.log"
        with log_path.open("wb") as log:
            server = subprocess.Popen(command, env=server_env, stdout=log, stderr=subprocess.STDOUT)
        client_env = {**os.environ, "PULSE_SERVER": f"unix:{socket}", "PULSE_RUNTIME_PATH": str(runtime),
                      "ALSA_CONFIG_PATH": f"{ALSA_DEFAULT_CONFIG}:{alsa_conf}"}  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (socket.exists() and fifo.exists()):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise PulseUnavailable(f"pulseaudio did not start: {log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        devices = cls(folder, client_env, server, MicFeeder(fifo), log_path=log_path)
        devices.pactl("set-default-sink", "spk")
        devices.pactl("set-default-source", "mic")
        return devices

    def pactl(self, *args: str) -> str:
        done = subprocess.run(["pactl", *args], env=self.env, capture_output=True, text=True, timeout=10, check=True)
        return done.stdout

    def streams(self) -> dict[str, list[str]]:
        """Client playback and recording streams now open, except this harness's own recorder."""
        result: dict[str, list[str]] = {}
        for kind in ("sink-inputs", "source-outputs"):
            lines = [line for line in self.pactl("list", "short", kind).splitlines() if line.strip()]
            if self.speaker is not None and kind == "source-outputs":
                lines = [line for line in lines if "spk.monitor" not in self._source_of(line)]
            result[kind] = lines
        return result

    def _source_of(self, line: str) -> str:
        # `pactl list short source-outputs`: index, source index, client, driver, spec; map the source index to its name
        fields = line.split("\t")
        sources = dict(
            (row.split("\t")[0], row.split("\t")[1])
            for row in self.pactl("list", "short", "sources").splitlines()
            if row.strip()
        )
        return sources.get(fields[1], "") if len(fields) > 1 else ""

    def stop(self) -> None:
        self.mic.stop()
        if self.speaker is not None:
            self.speaker.stop()
        self.server.terminate()
        try:
            self.server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait(timeout=5)
