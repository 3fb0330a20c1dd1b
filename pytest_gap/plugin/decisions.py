"""The lead's decisions, as pure functions of what it was told: no terminal, no files, no hooks.

The lead (lead.py: the single process, or the xdist controller) takes in every report of the
session and ends it. What each report means (`intake`), why a session that recorded nothing
stopped (`Stop`: the first reason wins), what a config's end is (`Outcome`) and what the session
exits with (`exit_status`) are decided here, so they are tested with fake reports and gates
(tests/test_lead_decisions.py) as xdist tests its schedulers with a MockNode.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gap import ids
from pytest_gap.errors import one_line
from pytest_gap.plugin.files import BENCHMARK_SUFFIXES, is_trial_nodeid
from pytest_gap.results import TrialResult

if TYPE_CHECKING:
    from pytest_gap.progress import Progress
    from pytest_gap.report import CellSummary, Gate


# -- record intake ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialRecord:
    """A trial's record, as its report brought it: the config it belongs to and its run dir."""

    config: Path
    result: TrialResult
    run_dir: Path
    replayed: bool  # an earlier session's record (--gap-resume), not run now


@dataclass(frozen=True)
class Intake:
    """What one test report means for the session."""

    record: TrialRecord | None = None  # a trial's record to fold in
    notes: tuple[str, ...] = ()  # said at the session's end (a re-run, a corrupt record)
    other_failure: bool = False  # a failed test that is no trial (it fails a gated session)
    stop: str | None = None  # a trial that never ran: why the session may record nothing


def intake(report: Any) -> Intake:
    """What a test report (pytest.TestReport, or its copy from an xdist worker) means: a trial's
    call report carries its record (item.carry_record); any other failure is counted, and one
    with no record (a broken fixture: the trial never ran) is a reason to stop."""
    run_dir = getattr(report, "gap_run_dir", None)
    record, notes, other_failure, stop = None, (), False, None
    if run_dir is not None:
        path = Path(getattr(report, "gap_result", {}).get("config") or "")
        if path.name:
            result = TrialResult.model_validate(report.gap_result)
            replayed = getattr(report, "gap_replayed", False)
            record = TrialRecord(path, result, Path(run_dir), replayed)
        notes = tuple(getattr(report, "gap_notes", []))
    elif report.failed and not is_trial_nodeid(report.nodeid):
        other_failure = True
    if report.failed and run_dir is None:  # a trial that never ran (a broken fixture)
        stop = f"{report.nodeid} failed in {report.when}: {crash_line(report)}"
    return Intake(record, notes, other_failure, stop)


def crash_line(report: Any) -> str:
    """The one line of a failed report: its exception and message, not the traceback."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return one_line(crash.message, 300)
    lines = [line for line in str(report.longrepr).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    return one_line((errors or lines or ["no detail"])[-1].removeprefix("E "), 300)


def selected_trials(selected: Iterable[str], rootpath: Path, config_path: Path) -> set[str]:
    """The trial ids of the config at `config_path` among the `selected` node ids (relative to
    `rootpath`)."""
    found = set()
    for nodeid in selected:
        yaml_part, trial_id = ids.split_node_id(nodeid)
        if (rootpath / yaml_part).resolve() == config_path:
            found.add(trial_id)
    return found


# -- stop reasons ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stop:
    """Why the session may end with no trial recorded, for `gap benchmark` (the report's
    "stopped"; its "error" too when it is a config problem)."""

    why: str
    on_config: bool = False


def first_stop(current: Stop | None, why: str, on_config: bool = False) -> Stop:
    """The first reason seen wins."""
    return current if current is not None else Stop(why.strip(), on_config)


def collect_stop(report: Any) -> Stop | None:
    """A failed collection: a benchmark config's problem (its full message: every problem of
    the file), or another file's (its one line)."""
    if not report.failed:
        return None
    config_file = Path(ids.path_of(report.nodeid)).suffix in BENCHMARK_SUFFIXES
    return Stop(str(report.longrepr) if config_file else crash_line(report), config_file)


def internal_error_stop(excrepr: Any) -> str:
    crash = getattr(excrepr, "reprcrash", None)
    return f"internal error: {one_line(crash.message if crash else excrepr, 300)}"


def interrupt_stop(excinfo: Any) -> str:
    return f"interrupted: {one_line(excinfo.exconly(), 300)}"


def stopped_report(stop: Stop | None, exitstatus: int) -> dict[str, Any]:
    """What a session that recorded no trial tells `gap benchmark`, in one line."""
    why = stop.why if stop is not None else None
    if why is None and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        why = "no trial was selected (check -k, -m, --gap-families, --gap-modes)"
    report: dict[str, Any] = {"passed": False, "configs": [], "stopped": why}
    if stop is not None and stop.on_config:
        report["error"] = why
    return report


# -- the end: outcomes and the exit status ---------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """One config's end of the session: its run dir folded (the gate, the cells) and what its
    preflight found down."""

    config: str
    run_dir: str
    gate: Gate
    cells: list[CellSummary]
    progress: Progress | None
    services_down: dict[str, str]  # {"llm" | "policies": why}


def passed(outcomes: Iterable[Outcome]) -> bool:
    return all(o.gate.passed for o in outcomes)


def report_document(outcomes: list[Outcome]) -> dict[str, Any]:
    """The --gap-report-json document of a session that recorded trials."""
    return {
        "passed": passed(outcomes),
        "configs": [
            {
                "config": o.config,
                "run_dir": o.run_dir,
                "gate": o.gate.model_dump(),
                # {"llm" | "policies": why}: `gap benchmark` exits 1 on any, gate or not (the
                # spec's preflight stops the run on a server down)
                "services_down": o.services_down,
            }
            for o in outcomes
        ],
    }


def exit_status(
    exitstatus: int,
    current: int,
    *,
    gate_on: bool,
    outcomes: list[Outcome],
    other_failures: int,
    output_errors: list[str],
) -> int:
    """The session's exit status. With the gate on, a session that ran (pytest says OK or
    TESTS_FAILED: `exitstatus`) exits as the gate says, and fails on a failed test that is no
    trial; a session whose summaries could not be written never exits OK. `current`: the
    status as the session holds it now (another plugin may have changed it)."""
    status = current
    if gate_on and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        failed = not passed(outcomes) or other_failures
        status = pytest.ExitCode.TESTS_FAILED if failed else pytest.ExitCode.OK
    if output_errors and status == pytest.ExitCode.OK:
        status = pytest.ExitCode.TESTS_FAILED  # the run has no summaries
    return status
