"""report.md: the summary tables, per-turn tables, the machine, the model configuration and the exact command.

`machine_info` reads /proc (the only I/O here); `render` is a pure function of the report dictionary.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scripts.report_lib.report_math import LATENCY_FIELDS, change

SUMMARY_ROWS: tuple[tuple[str, str], ...] = (
    ("endpoint_delay", "endpoint delay (ms)"),
    ("asr_final", "ASR final (ms)"),
    ("lm_first_pass", "LM first pass (ms)"),
    ("first_phrase_committed", "first phrase committed (ms)"),
    ("tts_first_chunk", "TTS first chunk (ms)"),
    ("first_audio_out", "first audio out (ms)"),
    ("voice_to_voice", "**voice-to-voice (ms)**"),
    ("client_voice_to_voice", "voice-to-voice at the client (ms)"),
    ("tokens_per_second", "LM tokens/s"),
    ("tokens_per_pass", "tokens per pass"),
)


def machine_info() -> dict[str, Any]:
    """CPU model, core count and memory of this machine (what the figures were measured on)."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_gib = None
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024**2, 1)
                break
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpu": cpu,
        "cores": usable,
        "memory_gib": memory_gib,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in load] if load else None,
    }


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def summary_table(runs: list[Mapping[str, Any]]) -> str:
    """One block per run: p50 / p90 / p95 / max of each figure, then speculation totals."""
    lines = []
    for run in runs:
        s = run["summary"]
        spoke, total = s["turns"]["spoke"], s["turns"]["total"]
        lines += [f"**{run['name']}** ({spoke} of {total} turns spoke)", "", "| | p50 | p90 | p95 | max |"]
        lines.append("|---|---|---|---|---|")
        for key, label in SUMMARY_ROWS:
            row = s[key]
            if row["count"] == 0:
                continue
            digits = 2 if key == "tokens_per_pass" else (1 if key == "tokens_per_second" else 0)
            cells = " | ".join(_fmt(row[q], digits) for q in ("p50", "p90", "p95", "max"))
            lines.append(f"| {label} | {cells} |")
        spec = s["speculation"]
        rate = "–" if spec["hit_rate"] is None else f"{100 * spec['hit_rate']:.0f} %"
        lines.append(
            f"| speculation | {spec['hits']} hits, {spec['misses']} misses ({rate}), "
            f"{spec['saved_ms_total']:.0f} ms saved in all | | | |"
        )
        eot = s.get("end_of_turn_speculation")
        if eot is not None and eot["started"]:
            lines.append(f"| end-of-turn speculation | {eot['started']} started, {eot['dropped']} dropped "
                         f"({100 * eot['adoption_rate']:.0f} % adopted) | | | |")
        lines.append("")
    return "\n".join(lines)


def comparison_table(runs: list[Mapping[str, Any]]) -> str:
    """Each configuration against the first (the baseline): what it took off p50 and p95 voice-to-voice."""
    if len(runs) < 2:
        return ""
    base = runs[0]["summary"]["voice_to_voice"]
    lines = [
        f"Against **{runs[0]['name']}**:",
        "",
        "| configuration | p50 voice-to-voice (ms) | change | p95 voice-to-voice (ms) | change | early LM used |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        s = run["summary"]
        v2v, turns = s["voice_to_voice"], s["turns"]
        cells = [str(run["name"])]
        for q in ("p50", "p95"):
            delta = change(base[q], v2v[q])
            if delta is None:
                moved = "–"
            else:  # 0.0 - x, not -x: the baseline against itself reads +0, not -0
                moved = f"{0.0 - delta['saved_ms']:+.0f} ms ({0.0 - delta['saved_percent']:+.0f} %)"
            cells += [_fmt(v2v[q]), moved]
        cells.append(f"{turns['early_lm_used']} of {turns['total']} turns")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def turns_table(run: Mapping[str, Any]) -> str:
    header = "| # | input | heard | " + " | ".join(LATENCY_FIELDS)
    header += " | prompt tok (encoded) | tok/s | tok/pass | hits | misses |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for turn in run["turns"]:
        latency, stats = turn["latency_ms"], turn["stats"]
        heard = (turn["transcript"] or "–").replace("|", "/")[:48]
        cells = [str(turn["index"]), Path(turn["source"]).name, heard]
        cells += [_fmt(latency[name]) for name in LATENCY_FIELDS]
        cells.append(f"{_fmt(stats['prompt_tokens'])} ({_fmt(stats['prompt_tokens_encoded'])})")
        cells += [_fmt(stats["tokens_per_second"], 1), _fmt(stats["tokens_per_pass"], 2)]
        cells += [_fmt(stats["hits"]), _fmt(stats["misses"])]
        lines.append("| " + " | ".join(cells) + " |")
    errors = [f"- turn {t['index']}: {'; '.join(t['errors'])}" for t in run["turns"] if t["errors"]]
    if errors:
        lines += ["", "Errors:", *errors]
    return "\n".join(lines)


def render(report: Mapping[str, Any], plots: Mapping[str, str]) -> str:
    machine, models = report["machine"], report["models"]
    runs = report["runs"]
    parts = [
        "# Latency report",
        "",
        f"Produced by `{report['command']}` on {report['created']} ({report['mode']} mode, "
        f"{'real-time' if report['realtime'] else 'as-fast-as-possible'} audio pacing).",
        "",
        "Stage figures are each stage's share of the critical path from the end of the user's speech to the first "
        "assistant sample; they add up to voice-to-voice. The endpoint delay is the endpointer's silence wait, "
        "included in the ASR stage.",
        "",
        "## Summary",
        "",
        summary_table(runs),
        comparison_table(runs),
        "## Plots",
        "",
        *(f"![{name}]({file})" for name, file in plots.items()),
        "",
        "## Machine",
        "",
        f"- CPU: {machine['cpu']}, {machine['cores']} usable cores, {_fmt(machine['memory_gib'], 1)} GiB memory",
        f"- {machine['os']}, Python {machine['python']}, load average at start {machine['load_average_at_start']}",
        "",
        "## Models",
        "",
        *(f"- {key}: {value}" for key, value in models.items()),
        "",
    ]
    for run in runs:
        parts += [f"## Turns: {run['name']}", "", f"Configuration: `{run['config']}`", "", turns_table(run), ""]
    return "\n".join(parts)
