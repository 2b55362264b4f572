"""This process's resident memory, split as the kernel counts it (/proc/self/status): anonymous pages (the heap:
tensors this process made) and file pages (memory-mapped files: a GGUF's blocks read in place, shared with the page
cache and dropped under pressure without writing anything)."""

from __future__ import annotations

from pathlib import Path

_FIELDS = {"VmRSS": "rss_mb", "RssAnon": "anonymous_mb", "RssFile": "file_mb", "VmHWM": "peak_rss_mb"}


def resident_memory() -> dict[str, float]:
    """{"rss_mb", "anonymous_mb", "file_mb", "peak_rss_mb"} in MB (10^6 bytes); an empty dict where there is no
    /proc (not Linux)."""
    status = Path("/proc/self/status")
    if not status.is_file():
        return {}
    found: dict[str, float] = {}
    for line in status.read_text().splitlines():
        key, _, value = line.partition(":")
        if key in _FIELDS:
            found[_FIELDS[key]] = int(value.split()[0]) * 1024 / 1e6  # kB
    return found
