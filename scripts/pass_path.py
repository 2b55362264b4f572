"""The path of one decoding pass, file by file, as it runs: from the voice session to the C kernel's call.

One spoken turn runs in file mode on the real models (a LibriVox sentence of pocketsphinx-testdata). The call stacks
are read where the answer crosses a thread and where the pass reaches C: on the event loop when the answer's LM run
starts, on the thread that hands the answer to the batch runner, and on the runner's thread at the first
`decode_layers` call. Every project file on those stacks is a file a reader follows to get from the session to the
kernel. Prints them in order and their count; `--json` writes them.

    python scripts/pass_path.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from model.process import watch
from scripts.report_lib.inputs import recorded_speech
from voice.engines import EngineConfig, load_engines
from voice.modes.files import run_files
from voice.turn.config import SessionConfig

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("model", "voice", "web")
LM_RUN = "voice/think/lm_run.py"
WATCH = "model/process/watch.py"  # the spans' own frames, below the call that marked one
# The model's spans (model/process/watch.py) whose stacks are the path's: where the answer reaches the runner, and
# the runner's first call of the C decode layer
PLACES = {watch.LM_SUBMIT: "worker thread: the answer reaches the runner",
          watch.DECODE_LAYERS: "runner thread: the pass reaches C"}


def project_files(stack: list[traceback.FrameSummary]) -> list[str]:
    """The project's files on `stack`, outermost first, each once."""
    seen: list[str] = []
    for frame in stack:
        path = Path(frame.filename).resolve()
        if path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in PACKAGES:
            name = str(path.relative_to(ROOT))
            if name not in seen and name != WATCH:
                seen.append(name)
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    clips = recorded_speech()
    if not clips:
        print("pass_path: needs Debian's pocketsphinx-testdata (make install installs it)", file=sys.stderr)
        return 2
    stacks: dict[str, list[str]] = {}
    to_thread = asyncio.BaseEventLoop.run_in_executor

    def recording_to_thread(self: Any, *args: Any) -> Any:
        found = project_files(traceback.extract_stack())
        if LM_RUN in found:  # the answer's thread, not a Whisper decode's or a Piper render's
            stacks.setdefault("event loop: the answer's thread starts", found)
        return to_thread(self, *args)

    def seen(span: watch.Span) -> None:  # told at the span's end, on its thread, its call still on the stack
        where = PLACES.get(span.kind)
        if where is not None:
            stacks.setdefault(where, project_files(traceback.extract_stack()))

    engines = load_engines(EngineConfig())  # its draft calibration's passes are not the session's: watched after
    asyncio.BaseEventLoop.run_in_executor = recording_to_thread  # type: ignore[method-assign]
    with watch.watching(seen):
        asyncio.run(run_files(engines, clips[:1], SessionConfig()))
    files: list[str] = []
    for where, found in stacks.items():
        print(f"{where}:\n  " + "\n  ".join(found))
        files.extend(name for name in found if name not in files)
    print(f"{len(files)} files from the session to the C call")
    if args.json:
        args.json.write_text(json.dumps({"stacks": stacks, "files": files}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
