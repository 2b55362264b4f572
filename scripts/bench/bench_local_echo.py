"""Local mode on open speakers: the assistant's answers come back into its microphone, with and without cancelling.

    python scripts/bench/bench_local_echo.py [--turns 8] [--delay-ms 120] [--gain-db -8] [--json FILE]

Starts a private PulseAudio server whose speaker is carried back into the microphone by PulseAudio's own loopback
(scripts/report_lib/pulse_devices.py `EchoPath`: 120 ms late, -8 dB), runs `voice-assistant` (local mode) on it, and
says the LibriVox clips of pocketsphinx-testdata into the microphone in real time, one question a turn; every other
answer is talked over 0.8 s after it is first heard with a card-name clip. Each configuration is one run: open speakers
(the default: the assistant cancels its own voice), `--headset` on the same open speakers (no cancelling: what a
full-duplex assistant without a canceller does), and `--half-duplex` (muted while it speaks: barge-ins are not heard).

Figures from the assistant's console and the recorded speaker: turns started by the echo (a `you:` line more than the
user said), answers cut by their own echo (an `[interrupted]` with no barge-in being said), barge-ins that stopped the
speaker within 1 s of reaching the microphone, and how the barge-ins were transcribed (word error rate).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.report_lib.local_assistant import AssistantFailed, LocalAssistant
from scripts.report_lib.pulse_devices import EchoPath, PulseUnavailable, VirtualDevices
from scripts.report_lib.results import print_and_save
from scripts.report_lib.speech_samples import card_clips, librivox_clips
from scripts.report_lib.wer import word_error_rate
from voice.audio import float32_to_pcm16, load_audio_16k

CONFIGS = {"cancelled": [], "headset, no cancelling": ["--headset"], "half duplex": ["--half-duplex"]}
BARGE_IN_AFTER_S = 0.8
ANSWER_WAIT_S = 90.0
QUIET_S = 1.5  # the answer is over once the speaker has been quiet this long
LONG_ANSWERS = "You are a storyteller. Answer every message with a story of at least three sentences."


def judge(lines: list[tuple[float, str]], said: list[tuple[float, float, bool]]) -> tuple[int, int]:
    """Turns started by the echo and answers cut by their own echo, from the console's timed lines. Each utterance
    of the user's explains one `you:` line, the first after it ends (half duplex hears a question said over an
    answer only once the answer is over): the `you:` lines left over were started by something else, the echo. An
    `[interrupted]` is the user's doing when an utterance began within the 4 s before it (a barge-in, or the next
    question said over an answer's tail); the others were the echo's."""
    ends = sorted(end for _, end, _ in said)
    echo_starts = 0
    for t in (t for t, line in lines if line.startswith("you: ")):
        if ends and ends[0] - 0.5 <= t:
            ends.pop(0)
        else:
            echo_starts += 1
    cut = [t for t, line in lines if "[interrupted]" in line]
    self_cuts = sum(1 for t in cut if not any(start <= t <= start + 4.0 for start, _, _ in said))
    return echo_starts, self_cuts


def run_config(devices: VirtualDevices, name: str, args: list[str], turns: int) -> dict[str, Any]:
    assert devices.speaker is not None
    questions, cards = librivox_clips(), card_clips()
    assistant = LocalAssistant(devices, ["--max-new-tokens", "48", "--system-prompt", LONG_ANSWERS, *args])
    assistant.wait_ready()
    said: list[tuple[float, float, bool]] = []  # (start, end, barge-in) as the assistant's microphone hears them
    stopped_after: list[float] = []
    heard_as: list[tuple[str, str]] = []

    spoken_before = len(devices.mic.clip_ends)  # the clips earlier configurations said into the same microphone

    def say(path: Path, barge_in: bool) -> tuple[float, float]:
        start = time.monotonic() + devices.mic_delay_s
        devices.mic.say(float32_to_pcm16(load_audio_16k(path)))
        end = devices.mic.wait_spoken(spoken_before + len(said) + 1, 60) + devices.mic_delay_s
        said.append((start, end, barge_in))
        return start, end

    try:
        for index in range(turns):
            _, speech_end = say(questions[index % len(questions)].path, barge_in=False)
            deadline = time.monotonic() + ANSWER_WAIT_S
            while (answer_at := devices.speaker.first_voice_after(speech_end)) is None:
                if time.monotonic() > deadline:
                    raise AssistantFailed(f"turn {index + 1}: no answer heard; console:\n{assistant.output()}")
                time.sleep(0.05)
            if index % 2 == 1:  # talk over this answer (one over before then leaves nothing to interrupt)
                time.sleep(max(0.0, answer_at + BARGE_IN_AFTER_S - time.monotonic()))
                card = cards[(index // 2) % len(cards)]
                lines_at_barge = len(assistant.lines)
                reaches_mic, barge_end = say(card.path, barge_in=True)
                spans = [span for span in devices.speaker.voiced_spans(answer_at) if span[0] < barge_end]
                interrupted = any("[interrupted]" in line for _, line in assistant.lines[lines_at_barge:])
                if spans and interrupted:
                    stopped_after.append(round(spans[-1][1] - reaches_mic, 3))
                try:
                    words = assistant.wait_line(r"^you: (.*)", 20, after=lines_at_barge).group(1)
                except AssistantFailed:
                    words = ""
                heard_as.append((card.text, words))
            # the answer (to the question, or to the barge-in) plays out and the room is quiet again
            deadline = time.monotonic() + ANSWER_WAIT_S
            while devices.speaker.sounding(time.monotonic() - QUIET_S, within_s=QUIET_S):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
    finally:
        assistant.stop()
    echo_starts, self_cuts = judge(assistant.lines, said)
    barge_ins = sum(1 for *_, barge_in in said if barge_in)
    return {
        "config": name, "args": args, "turns": turns, "user_utterances": len(said),
        "turns_started_by_echo": echo_starts,
        "answers_cut_by_their_echo": self_cuts,
        "barge_ins": barge_ins,
        "barge_ins_stopped_within_1s": sum(1 for s in stopped_after if s <= 1.0),
        "speaker_stopped_after_s": stopped_after,
        "barge_in_wer": word_error_rate(heard_as) if heard_as else None, "barge_ins_heard_as": heard_as,
        "fell_back": "microphone is muted" in assistant.output() and not args,
        "said": said, "console": assistant.lines,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--delay-ms", type=int, default=120)
    parser.add_argument("--gain-db", type=float, default=-8.0)
    parser.add_argument("--only", choices=sorted(CONFIGS), action="append", help="run only these configurations")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not librivox_clips() or not card_clips():
        print("bench_local_echo: pocketsphinx-testdata is not installed (`make install`)", file=sys.stderr)
        return 2
    results = []
    try:
        with (
            tempfile.TemporaryDirectory() as folder,
            VirtualDevices.start(Path(folder), echo=EchoPath(args.delay_ms, args.gain_db)) as devices,
        ):
            for name in args.only or list(CONFIGS):
                result = run_config(devices, name, CONFIGS[name], args.turns)
                print(f"{name}: {result['turns_started_by_echo']} turns started by the echo, "
                      f"{result['answers_cut_by_their_echo']} answers cut by it, "
                      f"{result['barge_ins_stopped_within_1s']} of {result['barge_ins']} barge-ins stopped within 1 s",
                      file=sys.stderr, flush=True)  # fmt: skip
                results.append(result)
    except (PulseUnavailable, AssistantFailed) as err:
        print(f"bench_local_echo: {err}", file=sys.stderr)
        return 2
    summary = [{k: v for k, v in r.items() if k not in ("barge_ins_heard_as", "args", "said", "console")}
               for r in results]
    echo_path = {"delay_ms": args.delay_ms, "gain_db": args.gain_db}
    print_and_save({"runs": summary}, {"echo_path": echo_path, "runs": results}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
