"""Local mode through virtual audio devices: N spoken turns, their underruns and voice-to-voice latency as heard.

    python scripts/bench/bench_local_mode.py [--turns 10] [--output-latency MS] [--json FILE]
        [-- EXTRA voice-assistant ARGS]

Starts a private PulseAudio server (scripts/report_lib/pulse_devices.py), runs `voice-assistant` (local mode) on it,
writes the LibriVox clips of pocketsphinx-testdata into the virtual microphone in real time, one turn each (after one
unreported warm-up turn), and records the virtual speaker. Per turn: the session's voice-to-voice (speech end to the
first answer sample handed to the device), voice-to-voice as heard (the last speech sample written into the microphone
pipe, less the clip's trailing silence, to the first answer energy on the speaker monitor: it adds the device
buffers), and the underruns the speaker
callback counted. `--compare-browser` then runs the same clips through the browser path (`scripts/load_test.py --spawn
--clients 1`: a WebSocket client streaming in real time; its server figure is the same session mark, its client figure
adds the socket) for the same number of turns.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from scripts.report_lib.local_assistant import TURN_SUMMARY, AssistantFailed, LocalAssistant
from scripts.report_lib.pulse_devices import MIC_RATE, PulseUnavailable, VirtualDevices
from scripts.report_lib.results import print_and_save
from scripts.report_lib.speech_samples import librivox_clips
from scripts.report_lib.stats import percentile
from voice.audio import float32_to_pcm16, load_audio_16k

TURN_TIMEOUT_S = 120.0
QUIET_S = 1.0  # the speaker must be silent this long before the next question (the answer has finished)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=10, help="reported turns (default 10)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--output-latency", type=float, help="speaker latency in ms (default: local mode's)")
    parser.add_argument("--json", type=Path, help="write every turn and the summary here")
    parser.add_argument("--compare-browser", action="store_true",
                        help="then the same clips and turns over the WebSocket (scripts/load_test.py --spawn)")
    parser.add_argument("extra", nargs="*", help="more voice-assistant arguments (after --)")
    return parser


def wait_quiet(devices: VirtualDevices, since: float, timeout_s: float = TURN_TIMEOUT_S) -> None:
    """Until the speaker has been silent for QUIET_S (the answer has played out)."""
    assert devices.speaker is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        spans = devices.speaker.voiced_spans(since)
        last_sound = spans[-1][1] if spans else since
        if time.monotonic() - last_sound > QUIET_S:
            return
        time.sleep(0.1)


def trailing_quiet_s(pcm: bytes, threshold: float = 0.02) -> float:
    """Seconds of near-silence at the end of a recording: the session's speech_end is its last voiced sample, so the
    heard latency starts there too, not at the end of the file."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    window = MIC_RATE // 50
    frames = samples[: len(samples) // window * window].reshape(-1, window)
    voiced = np.flatnonzero(np.sqrt(np.mean(frames**2, axis=1)) > threshold)
    return (len(frames) - 1 - voiced[-1]) * window / MIC_RATE if len(voiced) else 0.0


def run_turn(devices: VirtualDevices, assistant: LocalAssistant, pcm: bytes) -> dict[str, Any]:
    assert devices.speaker is not None
    spoken, console = len(devices.mic.clip_ends), len(assistant.lines)
    devices.mic.say(pcm)
    speech_end = devices.mic.wait_spoken(spoken + 1, 60) - trailing_quiet_s(pcm)
    summary = assistant.wait_line(TURN_SUMMARY, TURN_TIMEOUT_S, after=console)
    wait_quiet(devices, speech_end)
    heard_at = devices.speaker.first_voice_after(speech_end)
    said = [line for _, line in assistant.lines[console:] if line.startswith(("you: ", "assistant: "))]
    return {
        "console": said,
        "summary": summary.string.strip(),
        "voice_to_voice_ms": float(summary["v2v"]) if summary["v2v"] else None,
        "heard_voice_to_voice_ms": (heard_at - speech_end) * 1000 if heard_at is not None else None,
        "underruns": int(summary["underruns"]),
        "underruns_while_speaking": int(summary["audible"] or 0),
    }


def browser_figures(turns: int, max_new_tokens: int) -> dict[str, Any]:
    """p50 voice-to-voice of the same clips over the WebSocket path (one client, a spawned server)."""
    with tempfile.TemporaryDirectory(prefix="bench-browser-") as folder:
        out = Path(folder) / "load.json"
        load_test = Path(__file__).resolve().parents[1] / "load_test.py"
        command = [sys.executable, str(load_test), "--spawn", "--clients", "1",
                   "--turns", str(turns), "--max-new-tokens", str(max_new_tokens), "--json", str(out),
                   "--server-log", str(Path(folder) / "server.log")]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0 or not out.exists():
            return {"error": (done.stderr or done.stdout).strip()[-500:]}
        level = json.loads(out.read_text())["levels"][0]
    return {
        "command": "python scripts/load_test.py " + " ".join(command[2:-4]),
        "turns_completed": level["turns_completed"],
        "errors": level["errors"],
        "voice_to_voice_p50_ms": level["voice_to_voice_ms"]["p50"],
        "client_voice_to_voice_p50_ms": level["client_voice_to_voice_ms"]["p50"],
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    clips = librivox_clips()
    if not clips:
        print("bench_local_mode: pocketsphinx-testdata is not installed (`make install`)", file=sys.stderr)
        return 2
    speech = [float32_to_pcm16(load_audio_16k(clip.path)) for clip in clips]
    command = ["--max-new-tokens", str(args.max_new_tokens), *args.extra]
    if args.output_latency is not None:
        command += ["--output-latency", str(args.output_latency)]
    turns: list[dict[str, Any]] = []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-local-") as folder,
            VirtualDevices.start(Path(folder)) as devices,
        ):
            assistant = LocalAssistant(devices, command)
            try:
                assistant.wait_ready()
                run_turn(devices, assistant, speech[-1])  # warm-up: first-call costs stay out of the figures
                for index in range(args.turns):
                    turn = run_turn(devices, assistant, speech[index % len(speech)])
                    turns.append(turn)
                    print(f"turn {index + 1}: {turn['voice_to_voice_ms']} ms in the session, "
                          f"{turn['heard_voice_to_voice_ms'] or float('nan'):.0f} ms heard, "
                          f"{turn['summary']}  {turn['console']}", flush=True)  # fmt: skip
                code, exit_s = assistant.stop(signal.SIGINT)
                alsa_lines = sum("ALSA lib" in line for _, line in assistant.lines)
            finally:
                assistant.kill()
    except (PulseUnavailable, AssistantFailed, TimeoutError) as err:
        print(f"bench_local_mode: {err}", file=sys.stderr)
        return 2
    session = [t["voice_to_voice_ms"] for t in turns if t["voice_to_voice_ms"] is not None]
    heard = [t["heard_voice_to_voice_ms"] for t in turns if t["heard_voice_to_voice_ms"] is not None]
    result = {
        "command": "python scripts/bench/bench_local_mode.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "turns": len(turns),
        "underruns": sum(t["underruns"] for t in turns),
        "turns_with_underruns": sum(1 for t in turns if t["underruns"]),
        "underruns_while_speaking": sum(t["underruns_while_speaking"] for t in turns),
        "alsa_console_lines": alsa_lines,
        "voice_to_voice_p50_ms": percentile(session, 50) if session else None,
        "heard_voice_to_voice_p50_ms": percentile(heard, 50) if heard else None,
        "exit_code": code,
        "exit_s": exit_s,
        "per_turn": turns,
    }
    if args.compare_browser:
        result["browser"] = browser_figures(args.turns, args.max_new_tokens)
    print_and_save({k: v for k, v in result.items() if k != "per_turn"}, result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
