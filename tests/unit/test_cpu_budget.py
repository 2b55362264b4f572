"""The CPU budget (model/process/cpu_budget.py): what each piece of work holds while it runs, and the wider teams
granted from what is left."""

from __future__ import annotations

import threading

import pytest

from model.process.cpu_budget import CpuBudget, Work


def test_a_wider_team_is_granted_only_where_nothing_else_holds_its_cores() -> None:
    cpu = CpuBudget(cores=2)
    with cpu.team(Work.LM, 1, 2) as team:
        assert team == 2 and cpu.holding() == {Work.LM: 2}
    with cpu.working(Work.ASR, 1), cpu.team(Work.TTS, 1, 2) as team:  # one core held by a decode: one thread
        assert team == 1 and cpu.holding() == {Work.ASR: 1, Work.TTS: 1}
    assert cpu.holding() == {}
    with cpu.team(Work.LM, 1, 2) as team:  # the decode ended: its core is free again
        assert team == 2
    with cpu.team(Work.LM, 2, 2) as team, cpu.team(Work.TTS, 1, 2) as other:
        assert (team, other) == (2, 1)  # nothing to widen past the cores: the usual team, held beside
        assert cpu.holding() == {Work.LM: 2, Work.TTS: 1}
    with cpu.team(Work.LM, 1, 4) as team:  # wider than the machine
        assert team == 1


def test_a_hold_ends_with_its_block_raised_or_not() -> None:
    cpu = CpuBudget(cores=2)
    with pytest.raises(RuntimeError), cpu.working(Work.DETECTOR, 1):
        assert cpu.holding() == {Work.DETECTOR: 1}
        raise RuntimeError("the call failed")
    assert cpu.holding() == {}


def test_two_callers_at_once_cannot_both_take_the_spare_cores() -> None:
    """The choice and the hold are one step: of callers that all ask at the same moment, only one gets the wide
    team."""
    cpu = CpuBudget(cores=2)
    start, done = threading.Barrier(8), threading.Barrier(9)
    teams: list[int] = []

    def ask() -> None:
        start.wait()
        with cpu.team(Work.LM, 1, 2) as team:
            teams.append(team)
            done.wait()  # every caller holds its team until all have chosen

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    done.wait()
    for thread in threads:
        thread.join()
    assert sorted(teams) == [1] * 7 + [2]  # the first to choose found the cores free; every other found them held
    assert cpu.holding() == {}
