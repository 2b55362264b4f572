"""Make scripts/ importable as it is when a script runs (`import report_lib...`, `import bench.bench_int8_linear`): the
tests check its helpers too."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = str(Path(__file__).resolve().parents[1] / "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
