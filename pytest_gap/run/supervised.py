"""A trial whose policy server the session supervises (servers/supervisor.py): waited for while
the server restarts, recorded as an infrastructure failure while it is down, re-run once when
the server died under it. Knows nothing of pytest; the plugin hands it the attempt to make.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gap.cells import Trial
from pytest_gap.layout import inside
from pytest_gap.results import EarlierAttempt, TrialResult, write_result
from pytest_gap.run.watchdog import Watchdog

if TYPE_CHECKING:
    from pytest_gap.servers.supervisor import ServerWatch


def run_supervised(
    trial: Trial,
    attempt: Callable[[Trial, list[EarlierAttempt]], TrialResult],
    watch: ServerWatch,
    watchdog: Watchdog,
    run_dir: Path,
) -> tuple[TrialResult, list[str]]:
    """Run a trial whose policy server the session supervises (servers/supervisor.py).

    `attempt(trial, earlier_attempts)` runs it once and records it. Before it runs, a restart
    in progress is waited out; a server that is down records the trial as an infrastructure
    failure that says why, without running it. An infrastructure failure caused by the server
    dying is already recorded (result.json) when the restart is awaited: the trial is re-run
    once into the same trial dir, its record listing the broken attempt (`earlier_attempts`),
    so a trial is never lost nor counted twice. If the server cannot be kept up, the broken
    record's error says so. Waiting is not charged to the watchdog; a re-run gets a full budget.
    Returns the final record and notes for the session's output.
    """
    watchdog.pause()
    try:
        before = watch.before_trial()
    finally:
        watchdog.resume()
    if before.down:
        down = trial.model_copy(update={"cell": trial.cell.unavailable({"policies": before.down})})
        return attempt(down, []), []
    result = attempt(trial, [])
    notes: list[str] = []
    for may_rerun in (True, False):  # once at most: a server dying on every trial errors it
        if not result.infra_failure:
            break
        watchdog.pause()
        try:
            verdict = watch.after_failure(before)
        finally:
            watchdog.resume()
        if verdict.reason:  # the server cannot be kept up: the record says so
            result = result.model_copy(update={"error": f"{result.error}; {verdict.reason}"})
            write_result(inside(run_dir, trial.key), result)
            break
        if not (verdict.rerun and may_rerun):  # not a death, or re-run once already
            break
        broken = EarlierAttempt.of(result, verdict.because or "its policy server died")
        notes.append(
            f"{result.nodeid}: re-run, {verdict.because}; the broken attempt: {result.error}"
        )
        before = before.model_copy(update={"deaths": verdict.deaths})
        watchdog.restart()
        result = attempt(trial, [broken])
    return result, notes
