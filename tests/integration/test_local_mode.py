"""Local mode end to end on real (virtual) audio devices: a private PulseAudio server, `voice-assistant` in a child
process talking through PortAudio's ALSA backend, real recorded speech written into the microphone in real time, and
the speaker recorded from the null sink's monitor."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from scripts.report_lib.local_assistant import ROOT, LocalAssistant
from scripts.report_lib.open_speakers import voice_onset
from scripts.report_lib.pulse_devices import (
    SPEAKER_RATE,
    EchoPath,
    PulseUnavailable,
    SpeakerRecorder,
    VirtualDevices,
    find_delay,
    missing_parts,
    noise_burst,
)
from scripts.report_lib.speech_samples import LIBRIVOX_DIR
from tests.integration.ollama_store import OLLAMA_MODEL, smollm2_store
from voice.audio import TARGET_RATE, float32_to_pcm16, load_audio_16k

pytestmark = pytest.mark.slow

QUESTION = LIBRIVOX_DIR / "sense_and_sensibility_01_austen_64kb-0880.wav"  # "he was not an ill disposed young man"
BARGE_IN = LIBRIVOX_DIR / "sense_and_sensibility_01_austen_64kb-0930.wav"  # "he might even have been made amiable..."
TURN_TIMEOUT_S = 90.0
STREAMS_OPEN_S = 5.0  # how long a just-started assistant may take before PulseAudio lists both its streams
EXIT_WITHIN_S = 1.0
# Barge-in: the endpointer needs ~0.25 s of speech to call it speech, the session cancels and clears, and what is
# already queued in the device (the output latency, 150 ms) still plays out.
SPEAKER_STOPS_WITHIN_S = 1.0
BARGE_IN_AFTER_S = 1.0  # into the answer
LONG_ANSWERS = "You are a storyteller. Answer every message with a long story of at least five sentences."


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def speech(path: Path) -> bytes:
    return float32_to_pcm16(load_audio_16k(path))


def started_devices(folder: Path, echo: EchoPath | None = None) -> Iterator[VirtualDevices]:
    """The virtual devices for a module's tests, or a skip naming what this machine lacks."""
    if not QUESTION.is_file():
        pytest.skip("Debian's pocketsphinx-testdata is not installed (`make install` installs it)")
    if missing := missing_parts():
        pytest.skip(f"PulseAudio is not available: missing {', '.join(missing)} (`make install` installs it)")
    try:
        with VirtualDevices.start(folder, echo=echo) as started:
            yield started
    except PulseUnavailable as err:
        pytest.fail(str(err))  # installed but not starting is a failure, not a skip


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VirtualDevices]:
    yield from started_devices(tmp_path_factory.mktemp("pulse"))


@pytest.fixture(scope="module")
def echo_devices(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VirtualDevices]:
    """Devices of their own with open speakers (`EchoPath`): the room's monitor is the default source."""
    yield from started_devices(tmp_path_factory.mktemp("pulse-room"), EchoPath())


@pytest.fixture
def assistant_factory(devices: VirtualDevices) -> Iterator[list[LocalAssistant]]:
    started: list[LocalAssistant] = []
    yield started
    for assistant in started:
        assistant.kill()


def start(
    devices: VirtualDevices, started: list[LocalAssistant], *args: str, env: dict[str, str] | None = None
) -> LocalAssistant:
    assistant = LocalAssistant(devices, ["--max-new-tokens", "24", *args], env)
    started.append(assistant)
    assistant.wait_ready()
    # both devices are open: PulseAudio lists a stream once its server has set it up, which on a loaded machine can
    # come a moment after the assistant's own "ready"
    deadline = time.monotonic() + STREAMS_OPEN_S
    while not ((streams := devices.streams())["sink-inputs"] and streams["source-outputs"]):
        assert time.monotonic() < deadline, f"the assistant's devices are not open: {streams}"
        time.sleep(0.1)
    return assistant


def assert_released(devices: VirtualDevices) -> None:
    assert devices.streams() == {"sink-inputs": [], "source-outputs": []}


def assert_stops_cleanly(assistant: LocalAssistant, devices: VirtualDevices, signum: signal.Signals) -> None:
    """`signum` (Ctrl+C or SIGTERM): exit code 0, within EXIT_WITHIN_S, and both devices are free again."""
    code, took = assistant.stop(signum)
    assert code == 0, assistant.output()
    assert took < EXIT_WITHIN_S
    assert_released(devices)


def test_devices_are_listed_and_named_choices_are_checked(devices: VirtualDevices) -> None:
    env = {**devices.env, "PYTHONPATH": str(ROOT)}
    listed = subprocess.run([sys.executable, "-m", "web.cli", "--list-devices"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"\d+ pulse \(ALSA\)", listed.stdout) and re.search(r"\d+ default \(ALSA\)", listed.stdout)
    assert "ALSA lib" not in listed.stdout + listed.stderr
    missing = subprocess.run([sys.executable, "-m", "web.cli", "--input-device", "no-such-mic"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 2
    assert "no input device named 'no-such-mic'" in missing.stderr and "'pulse'" in missing.stderr


@pytest.mark.parametrize("model", ["bundled", "ollama"])
def test_a_spoken_question_is_answered_aloud_and_ctrl_c_exits_cleanly(
    devices: VirtualDevices, assistant_factory: list[LocalAssistant], model: str, tmp_path: Path
) -> None:
    """The bundled model, and (issue 47) the same base GGUF named as `ollama:smollm2:135m` from an Ollama store."""
    assert devices.speaker is not None
    args, env = ["--input-device", "pulse", "--output-device", "default"], None
    if model == "ollama":
        args, env = [*args, "--model", OLLAMA_MODEL], smollm2_store(tmp_path / "ollama")
    assistant = start(devices, assistant_factory, *args, env=env)
    spoken = len(devices.mic.clip_ends)
    asked_at = time.monotonic()
    devices.mic.say(speech(QUESTION))
    speech_end = devices.mic.wait_spoken(spoken + 1, 30)
    heard = assistant.wait_line(r"^you: (.*)", TURN_TIMEOUT_S).group(1).lower()
    assert {"young", "man"} <= set(re.findall(r"[a-z]+", heard))
    assert assistant.wait_line(r"^assistant: (.+)", TURN_TIMEOUT_S).group(1).strip()
    summary = assistant.wait_line(r"\[voice-to-voice (\d+) ms, underruns (\d+)", TURN_TIMEOUT_S)
    # the turn's record carries the LM's end-of-turn probability (the summary line shows it)
    end_of_turn = re.search(r"LM end of turn (\d\.\d+)", summary.string)
    assert end_of_turn and 0.0 <= float(end_of_turn.group(1)) <= 1.0, summary.string
    print(f"{model}: heard {heard!r}; {summary.string.strip()}")
    time.sleep(1.0)  # the answer's audio plays out
    # the answer is on the speaker, after the question; the speaker was silent while the user spoke
    spans = devices.speaker.voiced_spans(asked_at + 0.2)
    assert spans, f"no speech on the speaker; console:\n{assistant.output()}"
    assert spans[0][0] > speech_end
    assert sum(end - begin for begin, end in spans) > 0.3
    v2v_heard_ms = (spans[0][0] - speech_end) * 1000
    # the session's own voice-to-voice (first sample handed to the device) is within a second of what is heard
    assert abs(v2v_heard_ms - int(summary.group(1))) < 1000
    assert "ALSA lib" not in assistant.output()
    assert_stops_cleanly(assistant, devices, signal.SIGINT)


def test_sigterm_exits_cleanly_within_a_second(
    devices: VirtualDevices, assistant_factory: list[LocalAssistant]
) -> None:
    assert_stops_cleanly(start(devices, assistant_factory), devices, signal.SIGTERM)


def ask_then_barge_in(devices: VirtualDevices, assistant: LocalAssistant) -> tuple[float, str]:
    """Say QUESTION, wait until its answer is heard, and talk over it (BARGE_IN) BARGE_IN_AFTER_S into the answer;
    returns how long the answer went on after the barge-in's voice reached the assistant's microphone, and the
    console as it was just before the barge-in."""
    assert devices.speaker is not None
    spoken = len(devices.mic.clip_ends)
    devices.mic.say(speech(QUESTION))
    speech_end = devices.mic.wait_spoken(spoken + 1, 30) + devices.mic_delay_s
    deadline = time.monotonic() + TURN_TIMEOUT_S
    while (answer_at := devices.speaker.first_voice_after(speech_end)) is None:
        assert time.monotonic() < deadline, f"the answer was never heard; console:\n{assistant.output()}"
        time.sleep(0.05)
    time.sleep(max(0.0, answer_at + BARGE_IN_AFTER_S - time.monotonic()))
    # barge in while the speaker is sounding, not in a pause between two phrases (a slow machine leaves gaps there),
    # so that the speaker going quiet afterwards is the barge-in's doing
    while not devices.speaker.sounding(answer_at):
        assert time.monotonic() < deadline, f"the answer went quiet and never resumed; console:\n{assistant.output()}"
        time.sleep(0.02)
    before = assistant.output()
    barge_in = load_audio_16k(BARGE_IN)
    # when the assistant's microphone starts hearing the barge-in's voice: the clip opens with 0.28 s of room tone,
    # which is nobody talking yet (bench_echo counts from the same point: `voice_onset`)
    barge_in_at = time.monotonic() + devices.mic_delay_s + voice_onset(barge_in) / TARGET_RATE
    devices.mic.say(float32_to_pcm16(barge_in))
    barge_in_end = devices.mic.wait_spoken(spoken + 2, 30) + devices.mic_delay_s
    assistant.wait_line(r"\[interrupted\]", TURN_TIMEOUT_S)
    # the answer's audio stops soon after the user starts talking, and stays off while they talk
    speaking = [span for span in devices.speaker.voiced_spans(answer_at) if span[0] < barge_in_end]
    assert speaking[-1][1] > barge_in_at - 0.3, "the answer was over before the barge-in: nothing to interrupt"
    return speaking[-1][1] - barge_in_at, before


def test_headset_barge_in_stops_the_speaker_and_keeps_what_was_heard(
    devices: VirtualDevices, assistant_factory: list[LocalAssistant]
) -> None:
    assert devices.speaker is not None
    assistant = start(devices, assistant_factory, "--headset", "--max-new-tokens", "64",
                      "--system-prompt", LONG_ANSWERS)  # fmt: skip
    stopped_after, _ = ask_then_barge_in(devices, assistant)
    end = assistant.wait_line(r"\[.*underruns \d+.*heard: '(.*)'\]", TURN_TIMEOUT_S)
    assert stopped_after < SPEAKER_STOPS_WITHIN_S, f"speaker went on {stopped_after:.2f} s after the barge-in"
    print(f"the speaker stopped {stopped_after:.2f} s after the barge-in's voice began; heard: {end.group(1)!r}")
    # the history keeps what was heard: the start of the answer, not all of it (the answer line comes when the LM
    # finished, which may be after the barge-in or never)
    heard = words(end.group(1))
    answered = [line for _, line in assistant.lines if line.startswith("assistant: ")]
    if answered:
        answer = words(answered[0].removeprefix("assistant: "))
        assert heard == answer[: len(heard)] and len(heard) < len(answer)
    assert "ALSA lib" not in assistant.output()
    code, _ = assistant.stop(signal.SIGINT)
    assert code == 0
    assert_released(devices)


def test_on_open_speakers_its_own_voice_starts_nothing_and_a_barge_in_stops_it(
    echo_devices: VirtualDevices, assistant_factory: list[LocalAssistant]
) -> None:
    """Open speakers, the default: the answer comes back into the microphone 120 ms late at -8 dB (PulseAudio's
    loopback, `EchoPath`), and the assistant cancels it: the echo starts no turn and cuts no answer, and the user
    talking over the answer stops it within a second, as with a headset."""
    devices = echo_devices
    assert devices.speaker is not None
    assistant = start(devices, assistant_factory, "--max-new-tokens", "64", "--system-prompt", LONG_ANSWERS)
    stopped_after, before_barge_in = ask_then_barge_in(devices, assistant)
    assistant.wait_line(r"\[.*underruns \d+.*heard: '(.*)'\]", TURN_TIMEOUT_S)
    # until the barge-in, the assistant heard only the question: its own voice (1 s of it, from the room) started no
    # turn and interrupted nothing, and the canceller neither fell behind nor lost the speaker
    assert re.findall(r"^you: ", before_barge_in, re.MULTILINE) == ["you: "], before_barge_in
    assert "[interrupted]" not in before_barge_in and "microphone is muted" not in before_barge_in, before_barge_in
    assert stopped_after < SPEAKER_STOPS_WITHIN_S, (
        f"speaker went on {stopped_after:.2f} s after the barge-in; console:\n{assistant.output()}")
    print(f"open speakers: the speaker stopped {stopped_after:.2f} s after the barge-in's voice reached the microphone")
    assert "ALSA lib" not in assistant.output()
    code, _ = assistant.stop(signal.SIGINT)
    assert code == 0


def test_speaker_recorder_timeline(devices: VirtualDevices) -> None:
    """The harness itself: a tone played to the speaker shows up where it was played."""
    assert devices.speaker is not None
    tone = (np.sin(np.arange(16000) * 2 * np.pi * 440 / 16000) * 8000).astype("<i2").tobytes()
    started = time.monotonic()
    subprocess.run(["pacat", "--playback", "--raw", "--format=s16le", "--rate=16000", "--channels=1"], input=tone,
                   env=devices.env, check=True, timeout=30)  # fmt: skip
    time.sleep(0.3)
    spans = devices.speaker.voiced_spans(started)
    assert spans and 0.8 < spans[0][1] - spans[0][0] < 1.3
    assert not devices.speaker.sounding(started)  # the tone is over


def recorded_since(anchor: float, samples: np.ndarray, since: float) -> np.ndarray:
    """A `SpeakerRecorder` recording (`audio()`) from monotonic time `since` on: 16 kHz float32."""
    first = round((since - anchor) * SPEAKER_RATE)
    assert first >= 0, f"the recording began {-first / SPEAKER_RATE:.3f} s after {since}"
    return samples[first:]


def test_room_echo_and_the_users_speech_reach_the_default_source(echo_devices: VirtualDevices) -> None:
    """The harness itself, with open speakers: what is recorded from the default source (what the assistant hears)
    has a noise burst played to the speaker ~120 ms later and ~8 dB down, and the speech written into the mic."""
    devices = echo_devices
    assert devices.speaker is not None and devices.echo == EchoPath(delay_ms=120, gain_db=-8.0)
    heard = SpeakerRecorder(devices.env, device="@DEFAULT_SOURCE@")
    try:
        deadline = time.monotonic() + 10
        while not (heard.audio()[1].size and devices.speaker.audio()[1].size):
            assert time.monotonic() < deadline, "nothing recorded from the speaker or the default source"
            time.sleep(0.05)
        time.sleep(0.3)  # both recordings start well before what is played
        # short and below 2 kHz: module-loopback resamples a little to hold its latency (see `noise_burst`)
        burst = noise_burst(0.3, 0.2, seed=1, below_hz=2000.0)
        started = time.monotonic()
        subprocess.run(["pacat", "--playback", "--raw", "--format=s16le", "--rate=16000", "--channels=1"],
                       input=(burst * 32767).astype("<i2").tobytes(), env=devices.env, check=True,
                       timeout=30)  # fmt: skip
        time.sleep(0.8)
        spans = devices.speaker.voiced_spans(started)
        assert spans, "the burst never reached the speaker"
        begin = spans[0][0] - 0.05
        reference = recorded_since(*devices.speaker.audio(), begin)[: int(0.4 * SPEAKER_RATE)]
        lag, gain_db, correlation = find_delay(reference, recorded_since(*heard.audio(), begin), SPEAKER_RATE // 2)
        delay_ms = lag * 1000 / SPEAKER_RATE
        print(f"echo: {delay_ms:.1f} ms later, {gain_db:+.1f} dB, correlation {correlation:.2f}")
        assert correlation > 0.5, "what the default source recorded is not the speaker's echo"
        assert 60 <= delay_ms <= 300
        assert -14 <= gain_db <= -4

        clip = speech(QUESTION)
        said = np.frombuffer(clip, dtype="<i2").astype(np.float32) / 32768
        spoken = len(devices.mic.clip_ends)
        devices.mic.say(clip)
        began = devices.mic.wait_spoken(spoken + 1, 30) - len(said) / SPEAKER_RATE
        time.sleep(0.6)
        # 0.4 s of the speech from where the voice begins (the clip opens with room tone)
        onset = voice_onset(said)
        reference = np.concatenate([np.zeros(int(0.05 * SPEAKER_RATE), np.float32),
                                    said[onset : onset + int(0.4 * SPEAKER_RATE)]])  # fmt: skip
        recording = recorded_since(*heard.audio(), began + onset / SPEAKER_RATE - 0.05)
        lag, gain_db, correlation = find_delay(reference, recording, SPEAKER_RATE // 2)
        delay_s = lag / SPEAKER_RATE
        print(f"speech: {delay_s * 1000:.1f} ms later (measured at start: {devices.mic_delay_s * 1000:.1f} ms), "
              f"{gain_db:+.1f} dB, correlation {correlation:.2f}")  # fmt: skip
        assert correlation > 0.5, "the speech written into the mic did not reach the default source"
        assert -3 <= gain_db <= 1
        assert delay_s < 0.4 and abs(delay_s - devices.mic_delay_s) < 0.05
    finally:
        heard.stop()


def test_speaker_recorder_knows_when_the_speaker_is_sounding(devices: VirtualDevices) -> None:
    assert devices.speaker is not None
    tone = (np.sin(np.arange(3 * 16000) * 2 * np.pi * 440 / 16000) * 8000).astype("<i2").tobytes()
    started = time.monotonic()
    playing = subprocess.Popen(["pacat", "--playback", "--raw", "--format=s16le", "--rate=16000", "--channels=1"],
                               stdin=subprocess.PIPE, env=devices.env)  # fmt: skip
    try:
        assert playing.stdin is not None
        playing.stdin.write(tone)
        playing.stdin.flush()
        deadline = time.monotonic() + 2.0
        while not devices.speaker.sounding(started):
            assert time.monotonic() < deadline, "a 3 s tone was never heard as sounding"
            time.sleep(0.02)
        assert time.monotonic() - started < 2.5  # heard while it plays, not after
    finally:
        playing.communicate(timeout=30)
    time.sleep(0.3)
    assert not devices.speaker.sounding(started)
