"""How a trial item gets its result in this process: run here, or waited for from Ray.

The role that runs trials keeps one of these under `TRIALS` (session.py): an xdist worker and a
single process keep `LocalTrials` (a worker's waits for its mode's phase first); with
`--gap-ray` the single process swaps in `RayTrials` once its trials started on the cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_gap.plugin.item import NO_ROOM, NotRecorded, TrialItem
from pytest_gap.plugin.session import GapSession
from pytest_gap.results import EXIT_TIMEOUT, TrialResult

if TYPE_CHECKING:
    from pytest_gap.scale.ray_executor import RayExecution


def no_wait(item: TrialItem) -> None:
    """A single process's trials start when pytest runs them."""


class LocalTrials:
    """Trials run in this process: --gap-resume replays a valid record; otherwise, once
    `wait_turn` lets it start, the trial runs here (re-run once if its managed policy server
    died under it)."""

    def __init__(self, session: GapSession, wait_turn: Callable[[TrialItem], None] = no_wait):
        self.session, self.wait_turn = session, wait_turn

    def result_of(self, item: TrialItem) -> tuple[TrialResult, bool]:
        replayed = item.recorded() if self.session.options.resume else None
        if replayed is None:
            self.wait_turn(item)
        result = replayed or self.supervised(item)
        return result, replayed is not None

    # The trial layer (the runner, the env pool, the policy supervisor) is imported by the
    # processes that run a trial only: this package is loaded by every pytest run of the
    # environment, a test suite's too.
    def supervised(self, item: TrialItem) -> TrialResult:
        """The trial, re-run once if the managed policy server it needs died under it and was
        restarted (run.supervised.run_supervised)."""
        from pytest_gap.run.supervised import run_supervised
        from pytest_gap.servers.supervisor import ServerWatch

        run_dir = item.loaded.run_dir
        watch = ServerWatch.for_cell(run_dir, item.trial.cell, item.loaded.config)
        if watch is None:
            return self.run(item, run_dir, item.trial)
        result, notes = run_supervised(
            item.trial,
            lambda trial, earlier: self.run(item, run_dir, trial, earlier),
            watch,
            item.watchdog,
            run_dir,
        )
        item.notes += notes
        return result

    def run(self, item: TrialItem, run_dir: Path, trial, earlier=()) -> TrialResult:
        from pytest_gap.run.trial import TrialRun
        from pytest_gap.sim.pool import env_pool

        session, loaded = self.session, item.loaded
        run = TrialRun(
            trial,
            run_dir,
            nodeid=item.nodeid,
            config=str(loaded.path),
            pool=env_pool(),
            worker=session.worker,
            policies=session.endpoints(loaded),
            llm=loaded.config.llm,
            max_validation_retries=loaded.config.composition.max_validation_retries,
            mode_table=session.mode_table,
            watchdog=item.watchdog,
            plan_digest=loaded.plan_digest,
            earlier_attempts=list(earlier),
        )
        try:
            return run.execute()
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise
            raise NotRecorded(exc, run_dir) from None
        except pytest.fail.Exception as exc:
            if "pytest-timeout" not in str(exc):
                raise
            item.watchdog.stand_down()  # back in Python: recording the timeout may take a while
            limit = item.trial.cell.timeout_s
            return run.abort(EXIT_TIMEOUT, f"timed out after {limit:g} s (the trial watchdog)")


class RayTrials:
    """Trials the Ray cluster runs (scale/ray_executor.py): the item waits for its trial's
    record; a trial the cluster was not given (--gap-resume replays it) is local's."""

    def __init__(self, execution: RayExecution, local: LocalTrials):
        self.execution, self.local = execution, local

    def result_of(self, item: TrialItem) -> tuple[TrialResult, bool]:
        if not self.execution.planned(item.nodeid):
            return self.local.result_of(item)
        item.watchdog.pause()  # its actor keeps the trial's time
        try:
            found = self.execution.result_of(item.nodeid)
        except OSError as exc:  # the controller could not write what the actor sent
            if exc.errno not in NO_ROOM:
                raise
            raise NotRecorded(exc, item.loaded.run_dir) from None
        if found is None:  # not sent: the sequential gate stopped its cell meanwhile
            item.skip_if_not_needed()
            return self.local.result_of(item)
        result, notes = found
        item.notes = item.notes + notes
        return result, False
