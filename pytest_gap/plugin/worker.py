"""The xdist worker's role (xdist's `remote.py` side): it collects and runs trials with what the
controller handed it.

The controller's stamp, the services its preflight found down and the policy servers it started
come in xdist's `workerinput`; so does the directory of the schedule's phase gate, which a trial
of a later mode waits on before it starts (pytest_gap/plugin/scheduling.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gap.ids import phase_of
from pytest_gap.layout import new_stamp
from pytest_gap.plugin.execution import LocalTrials
from pytest_gap.plugin.item import TrialItem
from pytest_gap.plugin.scheduling import PhaseGate, ab_phase, phases, wait_for_phase
from pytest_gap.plugin.session import TRIALS, GapSession, pin_devices


class Worker:
    """An xdist worker: collects and runs trials with what the controller handed it."""

    def __init__(self, config: pytest.Config):
        handed = config.workerinput
        self.session = GapSession(
            config,
            handed.get("gap_stamp") or new_stamp(),
            unavailable=handed.get("gap_unavailable", {}),
            policy_urls=handed.get("gap_policy_urls", {}),
        )
        self.phase_dir: str | None = handed.get("gap_phase_dir")  # scheduling.PhaseGate's
        self.phase_of: dict[str, int] = {}
        pin_devices(self.session.worker, handed.get("workercount"))
        config.stash[TRIALS] = LocalTrials(self.session, wait_turn=self.wait_turn)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Each item's phase, as the controller's scheduler numbers them (same collection)."""
        keys = {
            item.nodeid: ab_phase(item.nodeid, item.trial.cell.mode)
            for item in session.items
            if isinstance(item, TrialItem) and item.trial.cell.ab_pair
        }
        ids = [item.nodeid for item in session.items]
        found = phases(ids, lambda nodeid: keys.get(nodeid) or phase_of(nodeid))
        self.phase_of = dict(zip(ids, found, strict=True))

    def wait_turn(self, item: TrialItem) -> None:
        """A trial of a later mode starts once every earlier mode's trials are done."""
        if self.phase_dir is None or item.nodeid not in self.phase_of:
            return
        item.watchdog.pause()  # waiting for a mode is not the trial's time
        try:
            wait_for_phase(PhaseGate(Path(self.phase_dir)), self.phase_of[item.nodeid])
        finally:
            item.watchdog.resume()
