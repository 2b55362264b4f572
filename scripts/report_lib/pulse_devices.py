"""Virtual audio devices for local mode: a private PulseAudio server with a speaker and a microphone that a test drives.

    with VirtualDevices.start(folder) as devices:       # pulseaudio -n with only what we load, its own runtime dir
        devices.env                                     # give this to `voice-assistant`: PortAudio's ALSA sees pulse
        devices.mic.say(pcm16_16k)                      # real speech into the pipe source `mic`, in real time
        devices.speaker.first_voice_after(t)            # what reached the null sink `spk` (recorded from its monitor)

    with VirtualDevices.start(folder, echo=EchoPath()) as devices:   # open speakers on a desk (see `EchoPath`)
        devices.mic_delay_s                             # measured: how late the user's speech reaches the assistant

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
import re
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


@dataclass(frozen=True)
class EchoPath:
    """Open speakers on a desk (the defaults are `open_speakers.Room`'s): what is played on `spk` comes back into the
    microphone the assistant records `delay_ms` later and `gain_db` louder (negative: quieter), mixed with the user's
    speech from the pipe source `mic`.

    Built from PulseAudio's own modules, so the server does the mixing in real time:

        spk (null sink) ── spk.monitor ── module-loopback latency_msec=delay_ms, sink-input volume gain_db ─┐
        mic (pipe source) ─────────────── module-loopback at its lowest latency ──────────────────────────┤
                                                                                 room (null sink) ──── room.monitor
                                                                                 = the default source: what the
                                                                                   assistant records

    The delay is from `spk`'s monitor (what `SpeakerRecorder` records) to the default source. The echo loopback
    holds its latency (measured: 121 ms for 120, and the gain within 0.1 dB once settled). The user's speech
    path cannot be made fast: the pipe source has a fixed latency of one pipe buffer (4 KiB, 128 ms at 16 kHz s16
    mono) and module-loopback raises any lower `latency_msec` to it, so the user's speech reaches the assistant about
    130 ms later than without `echo`. `VirtualDevices.mic_delay_s` is that delay as measured at start (0 without
    `echo`; 132-137 ms seen); the loopback steers its latency slowly, so it wanders afterwards (119-134 ms seen
    up to 10 s later). Add it to `MicFeeder.clip_ends` to get when the assistant heard a clip end, so that
    latency figures (voice-to-voice) do not count it as the assistant's; it is good to ~15 ms.
    """

    delay_ms: int = 120
    gain_db: float = -8.0


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


def noise_burst(seconds: float, rms: float, seed: int = 0, below_hz: float = 3000.0) -> np.ndarray:
    """Noise at 16 kHz with nothing above `below_hz`, to find by cross-correlation after a trip through the server:
    module-loopback resamples to steer its latency (up to ~0.2 % off in its first seconds, ~0.02 % once settled),
    so over a burst white noise slides out of step with itself; short and low, it still correlates (~0.99)."""
    noise = np.random.default_rng(seed).standard_normal(int(seconds * MIC_RATE))
    spectrum = np.fft.rfft(noise)
    spectrum[int(below_hz / MIC_RATE * len(noise)) :] = 0
    noise = np.fft.irfft(spectrum, len(noise))
    return (noise * rms / np.sqrt(np.mean(noise**2))).clip(-1, 1).astype(np.float32)


def find_delay(reference: np.ndarray, recording: np.ndarray, max_lag: int) -> tuple[int, float, float]:
    """Where `reference` shows up in `recording` (both starting at the same moment, same rate): (lag in samples, up
    to `max_lag`; gain in dB, the RMS of the recording's lagged stretch against the reference's; the normalised
    correlation at that lag, 1.0 for an exact scaled copy, near 0 for something else)."""
    recording = recording[: len(reference) + max_lag]
    size = 1 << int(np.ceil(np.log2(len(reference) + len(recording))))
    correlation = np.fft.irfft(np.fft.rfft(recording, size) * np.conj(np.fft.rfft(reference, size)), size)
    lag = int(np.argmax(correlation[: max(1, min(max_lag, len(recording) - len(reference)) + 1)]))
    heard = recording[lag : lag + len(reference)]
    played = reference[: len(heard)]
    energy = float(np.sqrt(np.sum(played**2) * np.sum(heard**2)))
    if not energy:
        return lag, float("-inf"), 0.0
    gain_db = 10 * float(np.log10(max(float(np.sum(heard**2)), 1e-20) / float(np.sum(played**2))))
    return lag, gain_db, float(np.dot(played, heard)) / energy


@dataclass
class VirtualDevices:
    """A running private PulseAudio server with a null sink `spk` and a pipe source `mic` (both the defaults), or with
    `echo`, `mic` and the echo of `spk` mixed into a null sink `room` whose monitor is the default source."""

    folder: Path
    env: dict[str, str]
    server: subprocess.Popen[bytes]
    mic: MicFeeder
    speaker: SpeakerRecorder | None = None
    log_path: Path = field(default_factory=Path)
    echo: EchoPath | None = None
    mic_delay_s: float = 0.0  # with `echo`: how late speech written to the mic pipe reaches the default source

    @classmethod
    @contextlib.contextmanager
    def start(cls, folder: Path, record: bool = True, echo: EchoPath | None = None):  # type: ignore[no-untyped-def]
        """Start the server, the microphone feeder and (with `record`) the speaker recorder; stop all on exit. With
        `echo`, the room is set up and `mic_delay_s` measured before this yields (three 0.1 s noise bursts said into
        the mic, not counted in `mic.clip_ends`; about 4 s more to start)."""
        if missing := missing_parts():
            raise PulseUnavailable("missing " + ", ".join(missing) + " (`make install` installs them)")
        devices = cls._launch(folder)
        try:
            if echo is not None:
                devices._open_room(echo)
            devices.mic.start()
            if echo is not None:
                devices.mic_delay_s = devices.measure_mic_delay()
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

    def _open_room(self, echo: EchoPath) -> None:
        """The null sink `room`, the two loopbacks into it (before the mic feeder starts, so nothing is queued in the
        pipe when the loopback starts reading it) and `room.monitor` as the default source."""
        self.pactl("load-module", "module-null-sink", "sink_name=room", f"rate={MIC_RATE}", "channels=1")
        common = ["sink=room", f"rate={MIC_RATE}", "channels=1", "source_dont_move=1", "sink_dont_move=1"]
        module = self.pactl("load-module", "module-loopback", "source=spk.monitor", f"latency_msec={echo.delay_ms}",
                            *common).strip()  # fmt: skip
        # latency_msec=1 asks for the lowest: PulseAudio raises it to the pipe source's fixed latency (and logs so)
        self.pactl("load-module", "module-loopback", "source=mic", "latency_msec=1", *common)
        self.pactl("set-sink-input-volume", self._sink_input_of(module), f"{echo.gain_db:.2f}dB")
        self.pactl("set-default-source", "room.monitor")
        self.echo = echo

    def _sink_input_of(self, module: str) -> str:
        for block in self.pactl("list", "sink-inputs").split("Sink Input #")[1:]:
            if re.search(rf"^\s*Owner Module: {module}$", block, re.MULTILINE):
                return block.split(None, 1)[0]
        raise PulseUnavailable(f"module-loopback (module {module}) has no sink input")

    def measure_mic_delay(self, bursts: int = 3) -> float:
        """With `echo`: say short noise bursts into the mic and find them in `room.monitor`: the median of the seconds
        from a burst's first sample going into the pipe to its first sample in the room. `start` stores it in
        `mic_delay_s`; call it again (while no assistant listens: it would hear the bursts) to see how it wandered.

        The bursts are short (0.1 s) and below 1 kHz because module-loopback resamples to steer its latency, fast
        (~0.2 %) in its first seconds: a longer or brighter burst drifts out of step with itself."""
        room = SpeakerRecorder(self.env, device="room.monitor")
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not room.audio()[1].size:  # parec takes a moment to deliver its first samples
                if time.monotonic() > deadline:
                    raise PulseUnavailable("nothing could be recorded from room.monitor")
                time.sleep(0.05)
            spoken = len(self.mic.clip_ends)
            delays = []
            for index in range(bursts):
                time.sleep(0.3)  # the recording starts before the burst, with room to spare
                delays.append(self._find_in_room(room, noise_burst(0.1, 0.2, seed=index, below_hz=1000.0)))
            del self.mic.clip_ends[spoken:]  # the bursts are the harness's, not clips a test said
            return float(np.median(delays))
        finally:
            room.stop()

    def _find_in_room(self, room: SpeakerRecorder, burst: np.ndarray, early: float = 0.05, late: float = 0.5) -> float:
        """Say `burst` and find it in `room`'s recording, searching from `early` before it began to `late` after."""
        self.mic.say((burst * 32767).astype("<i2").tobytes())
        began = self.mic.wait_spoken(len(self.mic.clip_ends) + 1, START_TIMEOUT_S) - len(burst) / MIC_RATE
        time.sleep(max(0.0, began + len(burst) / MIC_RATE + late + 0.1 - time.monotonic()))
        anchor, samples = room.audio()
        first = int((began - early - anchor) * SPEAKER_RATE)
        window = samples[max(0, first) : first + int((early + late) * SPEAKER_RATE) + len(burst)]
        window = np.concatenate([np.zeros(max(0, -first), np.float32), window])
        reference = np.concatenate([np.zeros(int(early * MIC_RATE)), burst]).astype(np.float32)
        lag, _, correlation = find_delay(reference, window, int(late * SPEAKER_RATE))
        if correlation < 0.5:
            raise PulseUnavailable(f"the mic did not reach room.monitor (correlation {correlation:.2f})")
        return lag / SPEAKER_RATE

    def pactl(self, *args: str) -> str:
        done = subprocess.run(["pactl", *args], env=self.env, capture_output=True, text=True, timeout=10, check=True)
        return done.stdout

    def streams(self) -> dict[str, list[str]]:
        """Client playback and recording streams now open, except this harness's own recorder and loopbacks."""
        result: dict[str, list[str]] = {}
        for kind in ("sink-inputs", "source-outputs"):
            lines = [line for line in self.pactl("list", "short", kind).splitlines() if line.strip()]
            lines = [line for line in lines if "\tmodule-loopback.c\t" not in line]  # the room's own (`echo`)
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
