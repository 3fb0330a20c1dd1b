"""The single-process role (no xdist): it leads the session and runs its trials itself.

With `--gap-ray` its trials run on a Ray cluster instead (pytest_gap/scale/ray_executor.py):
after collection it hands the cluster every selected trial that has no record to replay, and
each item then waits for its own trial's record (execution.RayTrials).
"""

from __future__ import annotations

import functools
import sys

import pytest

from pytest_gap.errors import GapError
from pytest_gap.plugin.execution import LocalTrials, RayTrials
from pytest_gap.plugin.files import is_trial_nodeid
from pytest_gap.plugin.item import TrialItem
from pytest_gap.plugin.lead import Lead
from pytest_gap.plugin.session import TRIALS, pin_devices


class SingleProcess(Lead):
    """No xdist: leads the session and runs its trials in this process."""

    def __init__(self, config: pytest.Config):
        super().__init__(config)
        pin_devices(None, 1)  # one process owns every device
        self.local = LocalTrials(self.session)
        config.stash[TRIALS] = self.local
        self.ray_execution = None  # RayExecution, with --gap-ray

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """The session's plan: what collection kept after -k, -m, --lf and other deselection;
        with --gap-ray, its trials start on the cluster now."""
        self.tally.selected.update(i.nodeid for i in session.items if is_trial_nodeid(i.nodeid))
        address = self.options.ray
        if address and not self.config.option.collectonly:
            try:
                line = self.start_ray(address, session.items)
            except GapError as exc:
                self.usage_exit(exc)
            self.reporter.say(line)

    def start_ray(self, address: str, items: list[pytest.Item]) -> str:
        """Start the session's trials on the cluster at `address`: every trial item but those
        --gap-resume replays. Returns a line for the terminal; GapError when it cannot start."""
        # Ray's side of the harness: a --gap-ray session's only
        from pytest_gap.scale.ray_executor import RayExecution, session_namespace, session_setup
        from pytest_gap.scale.ray_policy import held_by_servers

        planned = [self.planned(item) for item in items if self.for_ray(item)]
        execution = RayExecution(address, namespace=session_namespace(self.session.stamp))
        setup = session_setup(self.config.pluginmanager.get_plugins(), self.session.mode_table)
        servers = self.policies.servers() if self.policies is not None else []
        line = execution.start(planned, setup, held_by_servers(servers))
        self.ray_execution = execution
        self.config.stash[TRIALS] = RayTrials(execution, self.local)
        return line

    def for_ray(self, item: pytest.Item) -> bool:
        """A trial the cluster runs: one --gap-resume does not replay from its record."""
        if not isinstance(item, TrialItem):
            return False
        return not (self.options.resume and item.recorded() is not None)

    def planned(self, item: TrialItem):
        """The trial of `item` as the cluster is given it (ray_executor.Planned)."""
        from pytest_gap.scale.ray_executor import Planned

        loaded, config = item.loaded, item.loaded.config
        return Planned(
            nodeid=item.nodeid,
            trial=item.trial,
            config=loaded.path,
            run_dir=loaded.run_dir,
            plan_digest=loaded.plan_digest,
            resources=config.trials.ray,
            endpoints=functools.partial(self.session.endpoints, loaded),
            benchmark=config,
            llm=config.llm,
            max_validation_retries=config.composition.max_validation_retries,
            needed=lambda: loaded.stopped(item.trial.cell) is None,
        )

    def parallel(self) -> int:
        """Under --gap-ray, the cluster's actors run trials at once."""
        return (
            len(self.ray_execution.slots) if self.ray_execution is not None else super().parallel()
        )

    def pytest_unconfigure(self) -> None:
        if self.ray_execution is not None:  # the actors this session started (also after Ctrl-C)
            self.ray_execution.close(shutdown=False)
        super().pytest_unconfigure()  # the policy servers, some maybe on Ray too
        ray = sys.modules.get("ray")
        if self.options.ray and ray is not None and ray.is_initialized():
            ray.shutdown()
