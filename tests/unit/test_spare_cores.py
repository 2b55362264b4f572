"""The spare-cores gauge (model/spare_cores.py): from /proc/stat samples to cores free for a wider team."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from model.spare_cores import CpuSample, Handover, SpareCores, read_sample, spare_cores, usable_cores


def test_spare_cores_are_the_idle_ones_and_those_of_the_work_that_handed_over() -> None:
    # 2 cores over the window back from the newest sample to the latest one at least the window older
    quiet = [CpuSample(0.0, 10.0), CpuSample(0.25, 10.5), CpuSample(0.5, 11.0)]
    assert spare_cores(quiet, 2, (), 0.5) == pytest.approx(2.0)  # nothing ran
    assert spare_cores(quiet, 2, (), 0.4) == pytest.approx(2.0)  # back to 0.0: the latest sample at least 0.4 s older
    assert spare_cores(quiet, 2, (), 1.0) is None  # no sample that old: nothing known
    assert spare_cores([], 2, (), 0.1) is None
    one_busy = [CpuSample(0.0, 10.0), CpuSample(0.5, 10.5)]  # one core idle, the other busy all along
    assert spare_cores(one_busy, 2, (), 0.5) == pytest.approx(1.0)  # another process, or other work of ours
    passes = [Handover(0.0, 0.25, 1), Handover(0.25, 0.5, 1)]  # ... the LM's passes, which hand over
    assert spare_cores(one_busy, 2, passes, 0.5) == pytest.approx(2.0)
    # a hand-over counts only for the part of it inside the window: a decode that ended before it held nothing
    assert spare_cores(one_busy, 2, [Handover(-1.0, 0.25, 1)], 0.5) == pytest.approx(1.5)
    both_busy = [CpuSample(0.0, 10.0), CpuSample(0.5, 10.0)]
    assert spare_cores(both_busy, 2, [Handover(0.0, 0.5, 2)], 0.5) == pytest.approx(2.0)  # a wide pass of ours
    assert spare_cores(both_busy, 2, passes, 0.5) == pytest.approx(1.0)  # the LM beside something else
    assert spare_cores([CpuSample(0.0, 5.0), CpuSample(1.0, 4.9)], 2, (), 0.5) == 0.0  # clipped


def test_read_sample_parses_the_cpu_line_and_an_unreadable_file_knows_nothing(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  300 20 40 1000 50 0 7 9 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    sample = read_sample(stat)
    assert sample is not None and sample.idle_s == pytest.approx(1050 / 100)  # idle + iowait, 100 ticks a second
    assert read_sample(tmp_path / "missing") is None
    stat.write_text("garbage\n")
    assert read_sample(stat) is None
    blind = SpareCores(tmp_path / "missing")
    assert not blind.readable and blind.now() is None
    assert blind.allows(1) and not blind.allows(2)  # nothing known: one thread only


def test_the_real_gauge_sees_another_process_on_a_core() -> None:
    """On this machine: while another process spins on one core, a team needing every core is not allowed."""
    gauge = SpareCores()
    if not gauge.readable or usable_cores() < 2:
        pytest.skip("no /proc/stat or a single core here")
    spin = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)
        spare = gauge.now(0.2)
        allowed = gauge.allows(gauge.cores)
    finally:
        spinner.kill()
        spinner.wait()
    assert spare is not None and spare <= gauge.cores - 0.6
    assert not allowed
