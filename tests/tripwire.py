"""The tripwire of a session that leaves out the `libero` tests (tests/tiers.py): armed in this
process and in every Python process it starts (tests/sim_guard/), so that a test which builds a
real simulator or starts a Python process all the same fails, naming what it built or started,
instead of slowing the tier down."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.sim_guard import gap_sim_guard
from tests.tiers import LIBERO, SLOW

GUARD_DIR = Path(gap_sim_guard.__file__).resolve().parent
_WATCHED = pytest.StashKey[tuple[Path, int]]()
PATH = "PYTHONPATH"


@dataclass(frozen=True)
class Forbidden:
    """What the tests of a session may not do: build a simulator when none of them carries
    `libero` alone; start a Python process when none carries `libero` at all (the fast tier)."""

    simulator: bool
    processes: bool


def forbidden(items: list[pytest.Item]) -> Forbidden:
    """Read from the tests the session runs, after `-m`, `-k` and any other selection."""
    simulator = processes = False
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        simulator |= LIBERO in marks and SLOW not in marks
        processes |= LIBERO in marks
    return Forbidden(simulator=not simulator, processes=not processes)


def arm(config: pytest.Config, forbid: Forbidden) -> Path:
    """Arm the tripwire for this process and (through PYTHONPATH and the environment, which
    every subprocess inherits) for all it starts; returns the folder of this process's trip
    logs (each xdist worker arms for itself, from the tests it collected). What it sets in the
    environment is put back when the session ends."""
    logs = Path(tempfile.mkdtemp(prefix="gap-sim-trips-"))
    saved = {k: os.environ.get(k) for k in (gap_sim_guard.ENV, gap_sim_guard.NO_PROCESS, PATH)}
    os.environ[gap_sim_guard.ENV] = str(logs / gap_sim_guard.SESSION_LOG)
    if forbid.processes:
        os.environ[gap_sim_guard.NO_PROCESS] = "1"
    path = os.environ.get(PATH, "")
    if str(GUARD_DIR) not in path.split(os.pathsep):
        os.environ[PATH] = os.pathsep.join(p for p in (str(GUARD_DIR), path) if p)
    gap_sim_guard.install()

    def disarm() -> None:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(logs, ignore_errors=True)

    config.add_cleanup(disarm)
    return logs


def watch(logs: Path, item: pytest.Item) -> None:
    """From the start of `item`'s setup, what it starts records trips in its module's log (a
    process a module fixture started keeps that log for later tests of the module; one left
    running by another module's test is not charged here)."""
    log = logs / (re.sub(r"[^\w.-]", "_", item.nodeid.split("::")[0]) + ".jsonl")
    log.touch()
    item.stash[_WATCHED] = (log, log.stat().st_size)
    os.environ[gap_sim_guard.ENV] = str(log)


def check(item: pytest.Item) -> None:
    """After `item`'s teardown: fail it if a process built a real simulator, or a Python
    process started, while it ran."""
    log, offset = item.stash[_WATCHED]
    lines = [line for line in _read_from(log, offset).splitlines() if line]
    built = [line for line in lines if '"built"' in line]  # a line cut short is still a trip
    if built:
        trips = "\n".join(built)
        pytest.fail(f"{gap_sim_guard.HOW_TO_FIX}; built:\n{trips}", pytrace=False)
    if lines:
        trips = "\n".join(lines)
        pytest.fail(f"{gap_sim_guard.HOW_TO_FIX_PROCESS}; started:\n{trips}", pytrace=False)


def _read_from(log: Path, offset: int) -> str:
    with log.open() as records:
        records.seek(offset)
        return records.read()
