"""The tripwire of a session that leaves out the `libero` tests (tests/tiers.py): armed in this
process and in every Python process it starts (tests/sim_guard/), so that a test which builds a
real simulator or starts a Python process all the same fails, naming what it built or started,
instead of slowing the tier down."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests.sim_guard import gap_sim_guard
from tests.tiers import LIBERO, SLOW

GUARD_DIR = Path(gap_sim_guard.__file__).resolve().parent
_WATCHED = pytest.StashKey[tuple[Path, int]]()


def _selects(config: pytest.Config, markers: set[str]) -> bool:
    expr = config.getoption("markexpr", "")
    return not expr or Expression.compile(expr).evaluate(lambda name, **kwargs: name in markers)


def deselects_libero(config: pytest.Config) -> bool:
    """Whether this session's `-m` expression leaves out a test that carries only `libero`
    (one that builds a simulator): then no test of it may build one."""
    return not _selects(config, {LIBERO})


def fast_tier_only(config: pytest.Config) -> bool:
    """Whether it also leaves out the tests that start processes (`libero` and `slow`): then no
    test of it may start a Python process either."""
    return deselects_libero(config) and not _selects(config, {LIBERO, SLOW})


def arm(config: pytest.Config) -> Path:
    """Arm the tripwire for this process and (through PYTHONPATH and the environment, which
    xdist workers and every subprocess inherit) for all it starts; returns the folder of this
    process's trip logs (a worker arms again, for a folder of its own)."""
    logs = Path(tempfile.mkdtemp(prefix="gap-sim-trips-"))
    os.environ[gap_sim_guard.ENV] = str(logs / gap_sim_guard.SESSION_LOG)
    if fast_tier_only(config):
        os.environ[gap_sim_guard.NO_PROCESS] = "1"
    path = os.environ.get("PYTHONPATH", "")
    if str(GUARD_DIR) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(GUARD_DIR), path) if p)
    gap_sim_guard.install()
    config.add_cleanup(lambda: shutil.rmtree(logs, ignore_errors=True))
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
    trips = [json.loads(line) for line in _read_from(log, offset).splitlines() if line]
    built = [trip for trip in trips if "built" in trip]
    if built:
        lines = "\n".join(json.dumps(trip) for trip in built)
        pytest.fail(f"{gap_sim_guard.HOW_TO_FIX}; built:\n{lines}", pytrace=False)
    if trips:
        lines = "\n".join(json.dumps(trip) for trip in trips)
        pytest.fail(f"{gap_sim_guard.HOW_TO_FIX_PROCESS}; started:\n{lines}", pytrace=False)


def _read_from(log: Path, offset: int) -> str:
    with log.open() as records:
        records.seek(offset)
        return records.read()
