"""The xdist controller's role (xdist's `DSession` side): it leads the session, its workers run
the trials.

Before xdist starts its workers it fits their number to the plan; each worker is handed what
the preflight found (the session's stamp, the services down, the policy servers' urls) in
xdist's `workerinput`; the schedule is pytest_gap/plugin/scheduling.py's (modes one after
another, a task's seeds on one worker); a worker that dies has its trial recorded here.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.workermanage import parse_tx_spec_config

from pytest_gap import ids
from pytest_gap.cells import Trial
from pytest_gap.plugin.files import is_benchmark_arg, is_trial_nodeid, session_config_paths
from pytest_gap.plugin.lead import Lead
from pytest_gap.plugin.scheduling import ModePhaseScheduling, PhaseGate, ab_phase
from pytest_gap.plugin.session import LoadedConfig
from pytest_gap.run.workers import capacity_warning, fit_workers


class Controller(Lead):
    """The xdist controller: leads the session; its workers run the trials."""

    def __init__(self, config: pytest.Config):
        super().__init__(config)
        self._phase_dir: Path | None = None

    def fit_workers(self, loaded: list[LoadedConfig]) -> None:
        """Before xdist starts its workers (its sessionstart runs last): no more of them than
        the planned trials, when the session runs benchmark configs only and every one loaded
        (-k and -m select later, at collection: the plan is the bound known now), and a
        warning when they outnumber the cores or the memory."""
        option = self.config.option
        tx = list(getattr(option, "tx", None) or [])
        paths = session_config_paths(self.config)
        fittable = (
            tx
            and set(tx) == {"popen"}
            and paths
            and len(loaded) == len(paths)
            and all(is_benchmark_arg(self.config, a) for a in self.config.args)
        )
        if not fittable:  # a test suite, custom --tx specs, a config that did not load
            return
        n_trials = sum(len(cell.trials()) for c in loaded for cell in c.cells)
        workers = fit_workers(len(tx), n_trials)
        if workers < len(tx):
            option.tx, option.numprocesses = ["popen"] * workers, workers
            self.reporter.say(
                f"{len(tx)} workers asked for {n_trials} planned trial"
                f"{'s' if n_trials != 1 else ''}: starting {workers}"
            )
        warning = capacity_warning(workers)
        if warning:
            self.reporter.say(warning)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """Every worker writes into this session's run dir stamp and plans the same errored
        cells; its trials find the policy servers started here (the preflight ran before)."""
        node.workerinput["gap_stamp"] = self.session.stamp
        node.workerinput["gap_unavailable"] = self.session.unavailable
        node.workerinput["gap_policy_urls"] = self.session.policy_urls
        if self._schedules(self.config):
            node.workerinput["gap_phase_dir"] = str(self.phase_dir)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        """The session's plan, as each worker collected it after its deselection (-k, -m,
        --lf); every worker collects the same items."""
        self.tally.selected.update(i for i in ids if is_trial_nodeid(i))

    @property
    def phase_dir(self) -> Path:
        """Where the scheduler tells workers which modes are done (scheduling.PhaseGate)."""
        if self._phase_dir is None:
            self._phase_dir = Path(tempfile.mkdtemp(prefix="gap-phases-"))
        return self._phase_dir

    @staticmethod
    def _schedules(config: pytest.Config) -> bool:
        """Benchmark sessions with xdist's default `--dist load` get our scheduler, when every
        worker is local (`popen`): its phase gate is a directory they all see."""
        if config.getoption("dist") != "load":
            return False
        if not all(spec.startswith("popen") for spec in parse_tx_spec_config(config)):
            return False
        return any(is_benchmark_arg(config, a) for a in config.args)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        """Modes one after another, a task's seeds on one worker (plugin/scheduling.py)."""
        if not self._schedules(config):
            return None
        numnodes = len(parse_tx_spec_config(config))
        return ModePhaseScheduling(
            config,
            log,
            gate=PhaseGate(self.phase_dir),
            numnodes=numnodes,
            turn_of=self.turn_of,
            phase_key=self.phase_key,
        )

    def _trial(self, nodeid: str) -> Trial | None:
        if not is_trial_nodeid(nodeid):
            return None
        yaml_part, trial_id = ids.split_node_id(nodeid)
        return self.session.load(self.config.rootpath / yaml_part).trials.get(trial_id)

    def turn_of(self, nodeid: str) -> tuple[tuple[str, str], int] | None:
        """(cell, block) of a trial of a cell gated sequentially; None for any other item."""
        trial = self._trial(nodeid)
        if trial is None or not trial.cell.block_seeds:
            return None
        return (ids.path_of(nodeid), trial.cell.turn_key), trial.cell.block_of(trial.seed)

    def phase_key(self, nodeid: str) -> str:
        """Its mode's phase, or both arms' of an A/B pair (scheduling.ab_phase)."""
        trial = self._trial(nodeid)
        if trial is not None and trial.cell.ab_pair:
            return ab_phase(nodeid, trial.cell.mode)
        return ids.phase_of(nodeid)

    def pytest_unconfigure(self) -> None:
        super().pytest_unconfigure()
        if self._phase_dir is not None:
            shutil.rmtree(self._phase_dir, ignore_errors=True)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report, sched) -> None:
        """Record the trial of a worker that died; the report then reaches logreport."""
        if not is_trial_nodeid(crashitem):
            return
        from pytest_gap.run.record import record_crash  # the trial layer: a crash's only

        yaml_part, trial_id = ids.split_node_id(crashitem)
        loaded = self.session.load(self.config.rootpath / yaml_part)
        trial = loaded.trials.get(trial_id)
        if trial is None:
            return
        endpoint = self.session.endpoints(loaded).get(trial.cell.policy_id or "")
        result = record_crash(
            trial,
            loaded.run_dir,
            nodeid=crashitem,
            config=str(loaded.path),
            detail=str(report.longrepr),
            plan_digest=loaded.plan_digest,
            policy_url=endpoint.url if endpoint is not None else None,
        )
        report.gap_result = result.model_dump(mode="json")
        report.gap_run_dir = str(loaded.run_dir)
        report.longrepr = f"{report.longrepr}\n{result.message()}"
