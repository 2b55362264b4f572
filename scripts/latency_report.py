"""Latency report: run real spoken turns through the real pipeline and show where every millisecond goes.

    python scripts/latency_report.py [AUDIO ...|--audio-dir DIR] [--ws ws://HOST:PORT/ws] [--turns N]
                                     [--out DIR] [--compare|--compare-all] [--realtime/--no-realtime]

In-process (default) it drives a `Session` with the bundled models; with `--ws` it is a client of a running
`voice-assistant serve`, so the figures include the socket path and the server's own scheduling. Writes report.json,
report.md and PNG plots to --out. `--compare` runs the same turns with speculation and early LM start off, then on
(`--compare-all` also each alone). Exit code 2 (one line on stderr) for an unreachable server or an input that is not
audio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from scripts.report_lib.inputs import InputError, check_audio, pick_turns, resolve_inputs
from scripts.report_lib.report_math import summary, turn_record
from scripts.report_lib.runners import InProcessRunner, ServerUnreachable, TurnResult, WebSocketRunner
from scripts.report_lib.work_trace import WorkTrace, instrument, render_summary, work_summary
from voice.errors import AudioFormatError, VoiceError
from voice.think.spoken import spoken_answer

# (name, speculation, early LM start)
DEFAULT_RUN = ("speculation + early LM", True, True)
COMPARE_RUNS = (("baseline (both off)", False, False), DEFAULT_RUN)
EACH_ALONE = (("speculation only", True, False), ("early LM only", False, True))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("audio", nargs="*", type=Path, help="WAV files, one spoken user turn each (any sample rate)")
    parser.add_argument("--audio-dir", type=Path, help="also every .wav file of this folder")
    parser.add_argument("--conversational", action="store_true",
                        help="also 12 conversational questions no test uses, half with a pause inside (synthesised)")
    parser.add_argument("--ws", help="client of a running server instead, e.g. ws://127.0.0.1:8765/ws")
    parser.add_argument("--turns", type=int, help="number of turns (cycles through the inputs; default: each once)")
    parser.add_argument("--out", type=Path, default=Path("artifacts/latency"), help="output folder")
    compare = parser.add_mutually_exclusive_group()
    compare.add_argument("--compare", action="store_true", help="speculation and early LM start off, then on")
    compare.add_argument("--compare-all", action="store_true", help="--compare plus each of the two alone")
    parser.add_argument("--realtime", action=argparse.BooleanOptionalAction, default=True,
                        help="stream audio at real-time pace (default), as a microphone would")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                        help="run one unreported turn first, so first-call costs do not land on turn 1")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="answer length limit (in-process)")
    parser.add_argument("--threshold", type=float, help="the LM's confidence threshold (in-process)")
    parser.add_argument("--decoding", choices=("self-speculative", "autoregressive", "diffusion"),
                        help="the LM's decoding (in-process; default: the model's own)")
    parser.add_argument("--model", help="local diffusion LM checkpoint (in-process; default: the bundled model)")
    parser.add_argument("--adapter", type=Path,
                        help="the bundled model with this adapter folder instead (e.g. a training checkpoint)")
    parser.add_argument("--no-turn-detector", action="store_true",
                        help="end turns by silence alone, without Smart Turn (in-process)")
    parser.add_argument("--trace", action="store_true",
                        help="also time every model call and what ran beside it (trace.json, trace.md; in-process)")
    return parser


def _fail(message: str, code: int = 2) -> int:
    print(f"latency_report: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python scripts/latency_report.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.ws and (args.compare or args.compare_all):
        return _fail("--compare needs in-process mode: the server's configuration is fixed when it starts")
    if args.trace and (args.ws or args.compare or args.compare_all):
        return _fail("--trace times the models of one in-process configuration: drop --ws and --compare")
    try:
        paths = pick_turns(resolve_inputs(args.audio, args.audio_dir, args.conversational), args.turns)
        check_audio(sorted(set(paths)))
    except (InputError, AudioFormatError) as err:
        return _fail(str(err))
    runs = [DEFAULT_RUN]
    if args.compare or args.compare_all:
        runs = [*COMPARE_RUNS, *(EACH_ALONE if args.compare_all else ())]
    try:
        report = asyncio.run(_run_ws(args, paths)) if args.ws else _run_in_process(args, paths, runs)
    except ServerUnreachable as err:
        return _fail(str(err))
    except AudioFormatError as err:
        return _fail(str(err))
    except VoiceError as err:
        return _fail(f"{type(err).__name__}: {err}", code=1)
    report["command"] = command
    written = write_report(report, args.out)
    print(f"report written to {args.out} ({', '.join(sorted(p.name for p in written))})", file=sys.stderr)
    from scripts.report_lib.page import comparison_table, summary_table

    print(summary_table(report["runs"]))
    print(comparison_table(report["runs"]))
    if "work" in report:
        print(render_summary(report["work"]))
    return 0


# --- in-process ------------------------------------------------------------------------------------------------------
def _run_in_process(args: argparse.Namespace, paths: list[Path], runs: list[tuple[str, bool, bool]]) -> dict:
    from model.chat.spec import DecodingSettings, ModelSpec
    from model.errors import ModelError
    from voice.engines import EngineConfig, load_engines
    from voice.turn.session import SessionConfig

    print("loading models...", file=sys.stderr, flush=True)
    try:
        # an adapter folder is a model of its own: the bundled base carrying that adapter (model/loading.py)
        source = args.model or (str(args.adapter) if args.adapter else None)
        lm = ModelSpec(source=source, decoding=DecodingSettings(decoding=args.decoding, threshold=args.threshold))
        engines = load_engines(EngineConfig(lm=lm, turn_detector=not args.no_turn_detector))
    except ModelError as err:
        raise VoiceError(f"the language model could not be loaded: {err}") from err
    base = SessionConfig(generation=spoken_answer(max_new_tokens=args.max_new_tokens), wait_for_playback=False)
    report = _report_head(args, "in-process")
    report["models"] = _model_info(engines, base, args.adapter)
    if args.warmup:
        asyncio.run(_warm_up(engines, base, paths[0]))
    configs = [
        replace(base, speculator=replace(base.speculator, enabled=speculation),
                turn_taking=replace(base.turn_taking, early_answer=early_lm))
        for _, speculation, early_lm in runs
    ]
    trace = WorkTrace()
    with instrument(trace) if args.trace else contextlib.nullcontext():
        results = asyncio.run(_in_process_turns(engines, configs, paths, args.realtime))
    if args.trace:
        report["trace"], report["work"] = trace.as_json(), work_summary(trace.intervals)
    for (name, speculation, early_lm), run_results in zip(runs, results, strict=True):
        report["runs"].append(_run_entry(name, {"speculation": speculation, "early_lm": early_lm}, run_results))
    return report


async def _warm_up(engines: Any, config: Any, path: Path) -> None:
    async with InProcessRunner(engines, config, realtime=False) as runner:
        await runner.run_turn(path)


async def _in_process_turns(
    engines: Any, configs: list[Any], paths: list[Path], realtime: bool
) -> list[list[TurnResult]]:
    """Each configuration is its own conversation; their turns are interleaved (turn 1 of each, then turn 2...), so
    a change in the machine's load during the run touches every configuration alike."""
    results: list[list[TurnResult]] = [[] for _ in configs]
    async with contextlib.AsyncExitStack() as stack:
        runners = [
            await stack.enter_async_context(InProcessRunner(engines, config, realtime=realtime)) for config in configs
        ]
        with tqdm(total=len(paths) * len(configs), unit="turn", file=sys.stderr) as progress:
            for path in paths:
                for runner, run_results in zip(runners, results, strict=True):
                    run_results.append(await runner.run_turn(path))
                    progress.set_postfix_str(_postfix(run_results[-1]))
                    progress.update()
    return results


def _model_info(engines: Any, config: Any, adapter_dir: Path | None) -> dict[str, Any]:
    lm = engines.lm
    sampler = getattr(lm, "sampler", None)
    info: dict[str, Any] = {
        "language model": getattr(lm, "name", type(lm).__name__),
        "sampler": str(sampler) if sampler is not None else "remote",
        "max new tokens": config.generation.max_new_tokens,
        "ASR": getattr(engines.asr, "name", "?"),
        "TTS": f"Piper, {engines.tts.sample_rate} Hz, {engines.tts.config.threads} thread(s), "
                f"{engines.tts.config.lead_threads} for a first phrase",
        "speculator": str(asdict(config.speculator)),
        "load seconds": {key: round(value, 1) for key, value in engines.load_seconds.items()},
    }
    folder = adapter_dir or Path(__file__).resolve().parents[1] / "model" / "bundled" / "default"
    card = folder / "adapter.json"
    if card.is_file():
        training = json.loads(card.read_text()).get("training", {})
        info["adapter"] = f"{folder}, modified {time.ctime(card.stat().st_mtime)}, training {training or 'unknown'}"
    return info


# --- WebSocket client ------------------------------------------------------------------------------------------------
async def _run_ws(args: argparse.Namespace, paths: list[Path]) -> dict:
    report = _report_head(args, "websocket")
    if args.warmup:
        async with WebSocketRunner(args.ws, realtime=False) as runner:
            await runner.run_turn(paths[0])
    results: list[TurnResult] = []
    async with WebSocketRunner(args.ws, realtime=args.realtime) as runner:
        report["models"] = {"server": args.ws, "ready": json.dumps(runner.ready)}
        for path in (progress := tqdm(paths, desc="websocket", unit="turn", file=sys.stderr)):
            results.append(await runner.run_turn(path))
            progress.set_postfix_str(_postfix(results[-1]))
    report["runs"].append(_run_entry("server configuration", {"server": args.ws}, results))
    return report


# --- shared ----------------------------------------------------------------------------------------------------------
def _postfix(result: TurnResult) -> str:
    v2v = result.latency_ms.get("voice_to_voice")
    return f"last {v2v:.0f} ms" if isinstance(v2v, int | float) else "last: no audio"


def _report_head(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    from scripts.report_lib.page import machine_info

    return {
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "mode": mode,
        "realtime": args.realtime,
        "machine": machine_info(),
        "models": {},
        "runs": [],
    }


def _run_entry(name: str, config: dict[str, Any], results: list[TurnResult]) -> dict[str, Any]:
    turns = [
        turn_record(
            index + 1,
            r.source,
            r.transcript,
            r.answer,
            r.latency_ms,
            r.stats,
            r.errors,
            r.client_voice_to_voice,
        )
        for index, r in enumerate(results)
    ]
    return {"name": name, "config": config, "turns": turns, "summary": summary(turns)}


def write_report(report: dict[str, Any], out: Path) -> list[Path]:
    from scripts.report_lib.page import render
    from scripts.report_lib.plots import plot_distribution, plot_timeline

    out.mkdir(parents=True, exist_ok=True)
    plots = {
        "timeline": plot_timeline(report["runs"], out / "timeline.png"),
        "voice-to-voice distribution": plot_distribution(report["runs"], out / "voice_to_voice.png"),
    }
    report["plots"] = {name: path.name for name, path in plots.items()}
    trace = report.pop("trace", None)  # its own file: thousands of intervals
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(render(report, report["plots"]))
    written = [out / "report.json", out / "report.md", *plots.values()]
    if trace is not None:
        (out / "trace.json").write_text(json.dumps(trace) + "\n")
        (out / "trace.md").write_text(_trace_page(report))
        written += [out / "trace.json", out / "trace.md"]
    return written


def _trace_page(report: dict[str, Any]) -> str:
    table = render_summary(report["work"])
    return (
        "# Model calls during the latency report\n\n"
        f"Produced by `{report.get('command', 'scripts/latency_report.py --trace')}` on {report['created']}. "
        "Every Whisper decode, Smart Turn verdict, LM pass and prefill and Piper render of the reported turns, "
        "grouped by what else ran during at least a quarter of it (scripts/report_lib/work_trace.py). "
        "All intervals are in trace.json.\n\n"
        f"{table}\n"
    )


if __name__ == "__main__":
    sys.exit(main())
