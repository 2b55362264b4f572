"""Benchmark speech synthesis and speculative TTS. Prints figures and writes them as JSON; asserts nothing.

1. Piper first-chunk latency for short first phrases (goal: at most 150 ms on 2 cores), p50/p90.
1b. The speaking stage on scripted drafts (one word committed per pass, the draft right from the first pass): commit
   to first audio of the first phrase with and without speculation. This measures the stage, not a model.
2. Speculation over held-out prompts with the diffusion LM running live (its passes compete with Piper for the same
   cores, as in the assistant): hit rate, milliseconds from a phrase's commit to its first audio with and without
   speculation (goal with: p50 at most 50 ms for the first phrase), CPU spent on wasted renders, and how the LM's own
   time changes. The drafts of the runs without speculation are then replayed through the speculator alone for a
   small grid of thresholds, which is how the defaults were chosen.

    python scripts/bench/bench_tts.py --json artifacts/bench_tts.json [--model SPEC | --adapter DIR] [--prompts 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from model.chat import ChatMessage, ChatModel, Draft, DraftPiece, GenerationOptions
from model.chat.spec import ModelSpec
from model.errors import ModelError
from scripts.report_lib.stats import percentile
from voice.events import AudioOut, Event, PhraseCommitted, SpeculationResult
from voice.speak.speculator import Commit, PhraseSpeculator, Render, SpeculatorConfig
from voice.speak.stage import SpeakReport, SpeakStage
from voice.speak.tts import PiperSynthesizer, TTSConfig
from voice.think.spoken import SPOKEN_RULES, SPOKEN_SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parents[2]

FIRST_PHRASES = [
    "Sure, I can help.", "Hello there!", "Good question.", "Of course.", "I think so.", "Yes, that works.",
    "Let me see.", "Not really.", "That sounds fun!", "I'm doing well.", "It depends.", "Great idea!",
    "I love that.", "Maybe later.", "Here you go.", "No problem.", "That's right.", "I'm not sure.",
    "Happy to help!", "Absolutely.",
]  # fmt: skip
FALLBACK_PROMPTS = [
    "What is your favorite color?", "How are you today?", "What should I cook tonight?", "Tell me a fun fact.",
    "What time is it in Tokyo?", "Do you like music?", "What is the capital of France?", "How do I boil an egg?",
    "What's a good book to read?", "Can you recommend a movie?", "What is two plus two?", "Why is the sky blue?",
    "What do you do for fun?", "Where should I travel this summer?", "How do I stay focused?", "What is a dog?",
    "Do you have any pets?", "What's the weather like?", "How tall is Mount Everest?", "What is your name?",
    "Who wrote Hamlet?", "How do plants grow?", "What's your favorite food?", "Can you tell me a joke?",
    "What is the moon made of?", "How do I learn to code?", "What sport do you like?", "How many days in a year?",
    "What is coffee?", "Should I learn piano?", "What is a good hobby?", "How do I make friends?",
    "What's the best way to sleep?", "What is rain?", "Do you like cats?", "How do airplanes fly?",
    "What is your dream job?", "What should I study?", "How do I save money?", "What is a rainbow?",
    "Where do you live?", "What is the ocean?", "Can you sing?", "What is happiness?", "How do I relax?",
    "What is a computer?", "Which season do you like?", "How do I get better at running?", "What is art?",
    "Why do we dream?",
]  # fmt: skip


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p90": None, "mean": None}
    return {"n": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "mean": statistics.fmean(values)}


# --- 1. Piper first-chunk latency ------------------------------------------------------------------------------------
def bench_first_chunk(threads: int) -> dict[str, Any]:
    started = time.perf_counter()
    synthesizer = PiperSynthesizer.load(TTSConfig(threads=threads))
    load_ms = (time.perf_counter() - started) * 1e3
    next(synthesizer.synthesize("Warm up."))
    latencies = []
    for phrase in FIRST_PHRASES:
        started = time.perf_counter()
        next(synthesizer.synthesize(phrase))
        latencies.append((time.perf_counter() - started) * 1e3)
    return {"threads": threads, "load_ms": load_ms, "first_chunk_ms": percentiles(latencies)}


# --- 2. speculation with the live LM ---------------------------------------------------------------------------------
async def live_drafts(
    model: ChatModel,
    prompt: str,
    options: GenerationOptions,
    record: list[tuple[int, Draft]],
    queue: asyncio.Queue[Draft | None],
) -> None:
    """The model's drafts onto `queue`, pulled one per thread call as the assistant's session does; each recorded
    with its time; `None` at the end."""
    messages = [ChatMessage("system", SPOKEN_SYSTEM_PROMPT), ChatMessage("user", prompt)]
    drafts = iter(model.stream_chat(messages, options))
    try:
        while (draft := await asyncio.to_thread(next, drafts, None)) is not None:
            record.append((time.monotonic_ns(), draft))
            await queue.put(draft)
    finally:
        queue.put_nowait(None)


async def speak_one(
    model: ChatModel, synthesizer: PiperSynthesizer, prompt: str, options: GenerationOptions, config: SpeculatorConfig
) -> dict[str, Any]:
    events: list[Event] = []
    record: list[tuple[int, Draft]] = []

    async def emit(event: Event) -> None:
        events.append(event)

    stage = SpeakStage(synthesizer, emit, session="bench", turn=0, config=config)
    queue: asyncio.Queue[Draft | None] = asyncio.Queue()
    lm_started = time.monotonic_ns()
    async with asyncio.TaskGroup() as group:
        group.create_task(live_drafts(model, prompt, options, record, queue), name="bench-drafts")
        report: SpeakReport = await stage.run(queue)
    committed = {e.phrase_id: e.t_ns for e in events if isinstance(e, PhraseCommitted)}
    first_audio: dict[int, int] = {}
    for event in events:
        if isinstance(event, AudioOut):
            first_audio.setdefault(event.phrase_id, event.t_ns)
    delays = {pid: (first_audio[pid] - committed[pid]) / 1e6 for pid in first_audio}
    return {
        "answer": record[-1][1].text if record else "",
        "record": record,
        "lm_ms": (record[-1][0] - lm_started) / 1e6 if record else 0.0,
        "first_phrase_delay_ms": delays.get(min(first_audio)) if first_audio else None,
        "phrase_delays_ms": list(delays.values()),
        "first_audio_ms": (min(first_audio.values()) - lm_started) / 1e6 if first_audio else None,
        "outcomes": [e.outcome for e in events if isinstance(e, SpeculationResult)],
        "report": report,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    outcomes = [o for run in runs for o in run["outcomes"]]
    first_outcomes = [run["outcomes"][0] for run in runs if run["outcomes"]]
    reports: list[SpeakReport] = [run["report"] for run in runs]
    return {
        "answers": len(runs),
        "phrases": len(outcomes),
        "hit_rate": outcomes.count("hit") / len(outcomes) if outcomes else None,
        "first_phrase_hit_rate": first_outcomes.count("hit") / len(first_outcomes) if first_outcomes else None,
        "outcomes": {name: outcomes.count(name) for name in ("hit", "miss", "none")},
        "first_phrase_commit_to_audio_ms": percentiles(
            [run["first_phrase_delay_ms"] for run in runs if run["first_phrase_delay_ms"] is not None]
        ),
        "all_phrases_commit_to_audio_ms": percentiles([d for run in runs for d in run["phrase_delays_ms"]]),
        "lm_start_to_first_audio_ms": percentiles(
            [run["first_audio_ms"] for run in runs if run["first_audio_ms"] is not None]
        ),
        "lm_ms": percentiles([run["lm_ms"] for run in runs]),
        "render_cpu_ms_total": sum(r.render_cpu_ms for r in reports),
        "wasted_cpu_ms_total": sum(r.wasted_cpu_ms for r in reports),
        "wasted_cpu_ms_per_answer": statistics.fmean(r.wasted_cpu_ms for r in reports) if reports else None,
        "saved_ms_total": sum(r.saved_ms for r in reports),
    }


def replay(records: list[list[tuple[int, Draft]]], config: SpeculatorConfig) -> dict[str, Any]:
    """The speculator alone over recorded drafts: how often its renders match the commit, how many renders are
    wasted, and how long before the commit the matching render was asked for (time the render has to finish)."""
    hits = phrases = wasted = 0
    leads: list[float] = []
    first_leads: list[float] = []
    for record in records:
        speculator = PhraseSpeculator(config)
        requested: dict[int, tuple[str, int]] = {}
        for t_ns, draft in record:
            for action in speculator.feed(draft):
                if isinstance(action, Render):
                    if action.phrase_id in requested:
                        wasted += 1
                    requested[action.phrase_id] = (action.text, t_ns)
                elif isinstance(action, Commit):
                    phrases += 1
                    render = requested.pop(action.phrase_id, None)
                    if render is not None and render[0] == action.text:
                        hits += 1
                        leads.append((t_ns - render[1]) / 1e6)
                        if action.phrase_id == 0:
                            first_leads.append((t_ns - render[1]) / 1e6)
                    elif render is not None:
                        wasted += 1
        if not speculator.finished:
            speculator.finish()
    return {
        "config": asdict(config),
        "hit_rate": hits / phrases if phrases else None,
        "wasted_renders_per_answer": wasted / len(records) if records else None,
        "render_lead_ms": percentiles(leads),
        "first_phrase_render_lead_ms": percentiles(first_leads),
    }


def scripted_drafts(answer: str, wrong: str | None = None) -> list[Draft]:
    """Drafts of `answer` that commit one word per pass and guess the rest from the first pass (or guess `wrong` for
    the uncommitted part until the last word)."""
    words = [word if index == 0 else " " + word for index, word in enumerate(answer.split())]
    guess = [word if index == 0 else " " + word for index, word in enumerate((wrong or answer).split())]
    drafts = []
    for committed in range(len(words) + 1):
        tail = guess[committed:] if wrong and committed < len(words) - 1 else words[committed:]
        pieces = [DraftPiece(w, True) for w in words[:committed]] + [DraftPiece(w, False, 0.9) for w in tail]
        drafts.append(Draft(step=committed, pieces=tuple(pieces), done=committed == len(words), finish_reason="stop"
                            if committed == len(words) else None))
    return drafts


async def bench_scripted(pass_ms: float, tts_threads: int) -> dict[str, Any]:
    """The stage's own mechanics on scripted drafts (not model output): how soon a committed first phrase is heard
    when its render was a hit, and when it is rendered only on commit."""
    synthesizer = PiperSynthesizer.load(TTSConfig(threads=tts_threads))

    async def paced(drafts: list[Draft], queue: asyncio.Queue[Draft | None]) -> None:
        for draft in drafts:
            await asyncio.sleep(pass_ms / 1e3)
            await queue.put(draft)
        await queue.put(None)

    results: dict[str, Any] = {"pass_ms": pass_ms, "answer_shape": "first phrase + ' How are you?'"}
    for name, config in (("speculation_on", SpeculatorConfig()), ("speculation_off", SpeculatorConfig(enabled=False))):
        delays: list[float] = []
        outcomes: list[str] = []
        for phrase in FIRST_PHRASES:
            events: list[Event] = []

            async def emit(event: Event, sink: list[Event] = events) -> None:
                sink.append(event)

            stage = SpeakStage(synthesizer, emit, session="bench", turn=0, config=config)
            queue: asyncio.Queue[Draft | None] = asyncio.Queue()
            async with asyncio.TaskGroup() as group:
                group.create_task(paced(scripted_drafts(phrase + " How are you?"), queue), name="bench-drafts")
                await stage.run(queue)
            commit = next(e.t_ns for e in events if isinstance(e, PhraseCommitted) and e.phrase_id == 0)
            audio = next(e.t_ns for e in events if isinstance(e, AudioOut) and e.phrase_id == 0)
            delays.append((audio - commit) / 1e6)
            outcomes.append(next(e.outcome for e in events if isinstance(e, SpeculationResult) and e.phrase_id == 0))
        results[name] = {"first_phrase_commit_to_audio_ms": percentiles(delays),
                         "first_phrase_outcomes": {o: outcomes.count(o) for o in set(outcomes)}}
    return results


def load_model(args: argparse.Namespace) -> ChatModel:
    if args.adapter:
        from model.bundled.default_model import load_default_chat_model

        return load_default_chat_model(ModelSpec(str(args.adapter)))
    from model.loading import load_chat_model

    return load_chat_model(ModelSpec(args.model))


async def bench_speculation(args: argparse.Namespace, prompts: list[str]) -> dict[str, Any]:
    try:
        model = load_model(args)
    except (ModelError, ImportError, OSError) as error:
        return {"status": "pending", "reason": f"model could not be loaded: {error}"}
    synthesizer = PiperSynthesizer.load(TTSConfig(threads=args.tts_threads))
    options = GenerationOptions(max_new_tokens=args.max_new_tokens, rules=SPOKEN_RULES)
    warm = await speak_one(model, synthesizer, "Hello!", options, SpeculatorConfig())
    del warm
    modes = {"speculation_on": SpeculatorConfig(), "speculation_off": SpeculatorConfig(enabled=False)}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
    for index, prompt in enumerate(prompts):
        for name, config in modes.items():  # alternate, so load changes hit both modes alike
            runs[name].append(await speak_one(model, synthesizer, prompt, options, config))
        if (index + 1) % 10 == 0:
            print(f"  {index + 1}/{len(prompts)} prompts", flush=True)
    records = [run["record"] for run in runs["speculation_off"]]
    grid = [
        SpeculatorConfig(stable_passes=k, min_confidence=c, first_phrase_words=w)
        for k in (1, 2, 3)
        for c in (0.0, 0.3, 0.5, 0.7)
        for w in (0, 5)
    ]
    return {
        "status": "measured",
        "model": getattr(model, "name", "?"),
        "max_new_tokens": args.max_new_tokens,
        "tts_threads": args.tts_threads,
        "defaults": asdict(SpeculatorConfig()),
        **{name: summarize(mode_runs) for name, mode_runs in runs.items()},
        "replay_grid": [replay(records, config) for config in grid],
        "examples": [
            {"prompt": p, "answer": r["answer"]} for p, r in zip(prompts[:5], runs["speculation_on"][:5], strict=False)
        ],
    }


def read_prompts(path: Path, limit: int) -> tuple[list[str], str]:
    if path.is_file():
        prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return prompts[:limit], str(path)
    return FALLBACK_PROMPTS[:limit], "built-in list"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=ROOT / "artifacts" / "bench_tts.json")
    parser.add_argument("--model", default=None, help="model spec for load_chat_model (default: the bundled model)")
    parser.add_argument("--adapter", default=None, help="a block-diffusion adapter folder to use on the bundled base")
    parser.add_argument("--prompts-file", type=Path, default=ROOT / "tests" / "data" / "heldout_prompts.txt")
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--tts-threads", type=int, default=TTSConfig().threads)
    parser.add_argument("--pass-ms", type=float, default=65.0, help="pass time of the scripted drafts")
    parser.add_argument("--skip-speculation", action="store_true", help="only the Piper latency part")
    args = parser.parse_args()

    results: dict[str, Any] = {"piper": [bench_first_chunk(threads) for threads in (1, 2)]}
    for row in results["piper"]:
        fc = row["first_chunk_ms"]
        print(f"piper first chunk, {row['threads']} thread(s): p50 {fc['p50']:.1f} ms, p90 {fc['p90']:.1f} ms "
              f"over {fc['n']} phrases (goal <= 150 ms)")
    scripted = asyncio.run(bench_scripted(args.pass_ms, args.tts_threads))
    results["scripted_stage"] = scripted
    for name in ("speculation_on", "speculation_off"):
        fp = scripted[name]["first_phrase_commit_to_audio_ms"]
        print(f"scripted drafts, {name}: first phrase commit->audio p50 {fp['p50']:.1f} ms, p90 {fp['p90']:.1f} ms "
              f"({scripted[name]['first_phrase_outcomes']})")
    if args.skip_speculation:
        results["speculation"] = {"status": "skipped"}
    else:
        prompts, source = read_prompts(args.prompts_file, args.prompts)
        speculation = asyncio.run(bench_speculation(args, prompts))
        speculation["prompts_source"] = source
        results["speculation"] = speculation
        if speculation["status"] == "measured":
            for name in ("speculation_on", "speculation_off"):
                s = speculation[name]
                fp = s["first_phrase_commit_to_audio_ms"]
                print(f"{name}: hit rate {s['hit_rate']}, first phrase commit->audio p50 {fp['p50']} ms "
                      f"p90 {fp['p90']} ms, wasted CPU {s['wasted_cpu_ms_total']:.0f} ms of "
                      f"{s['render_cpu_ms_total']:.0f} ms rendered, LM p50 {s['lm_ms']['p50']} ms")
        else:
            print(f"speculation: {speculation['status']} ({speculation.get('reason', '')})")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
