"""What every role of a session shares: its options, its stamp, the configs it loaded.

`GapSession` is kept in the stash under `SESSION` (as pytest's junitxml keeps its LogXML under
`xml_key`): collection loads configs through it, trial items find their endpoints and mode
table in it. How this process's trial items get their results (run here, or waited for from a
Ray cluster) is the role's choice, kept under `TRIALS` (execution.py); the controller of an
xdist session runs no item and keeps none.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pytest

from pytest_gap.ab_gate import recorded_pair_state
from pytest_gap.baseline import Baseline, BaselineState, load_baseline, start_problems
from pytest_gap.baseline import recorded_state as baseline_state
from pytest_gap.config.messages import ConfigError
from pytest_gap.errors import GapError
from pytest_gap.layout import POLICY_LOGS_DIR, resolve_run_dir
from pytest_gap.plugin.options import GapOptions
from pytest_gap.results import TrialResult
from pytest_gap.run.devices import pin
from pytest_gap.sequential import SequentialState, recorded_state
from pytest_gap.session_plan import SessionPlan, session_mode_table

if TYPE_CHECKING:
    from pytest_gap.cells import Cell
    from pytest_gap.compare.sequential_ab import ABState
    from pytest_gap.modes import ModeTable


class LoadedConfig(SessionPlan):
    """One benchmark YAML as this process sees it: config, plan, run dir."""

    def __init__(self, path: Path, session: GapSession):
        options = session.options
        super().__init__(
            path,
            session.mode_table,
            families=options.families,
            modes=options.modes,
            frames_every=options.frames_every,
            baseline=options.baseline,
        )
        output_dir = options.output_dir or self.config.output_dir
        self.run_dir = resolve_run_dir(output_dir, session.stamp, options.reuse_latest)
        self.mark_unavailable(session.unavailable.get(str(path), {}))
        self.baseline = self._baseline() if self.config.gate.baseline is not None else None

    def _baseline(self) -> Baseline:
        """The config's baseline, read and checked before any trial runs (ConfigError: a
        collection error, one line per refusal)."""
        from pytest_gap.provenance import harness_surface

        backend = self.config.benchmark.backend if self.config.benchmark else self.config.backend
        try:
            baseline = load_baseline(self.config, self.all_cells)
        except GapError as exc:
            raise ConfigError(str(self.path), [str(exc)]) from None
        surface = harness_surface(backend).model_dump()
        problems = start_problems(baseline, self.plan_digest, self.config.echo(), surface)
        if problems:
            raise ConfigError(str(self.path), problems)
        return baseline

    def stopped(self, cell: Cell) -> SequentialState | BaselineState | ABState | None:
        """The sequential gate's state of `cell` as the run dir records it now, when it needs
        no more trials (decided, or at its cap); None when the config does not gate
        sequentially or the cell goes on."""
        if self.config.compare is not None and cell.ab_pair:
            pair = recorded_pair_state(self.run_dir, cell, self.all_cells, self.config.compare)
            return pair if pair is not None and pair.stopped else None
        if self.baseline is not None and self.baseline.settings.sequential:
            state = baseline_state(self.run_dir, cell, self.all_cells, self.baseline)
            return state if state.stopped else None
        if self.config.rule != "sequential":
            return None
        state = recorded_state(
            self.run_dir, cell, self.all_cells, self.config.threshold, self.config.sequential_gate
        )
        return state if state.stopped else None


class GapSession:
    """What every role shares: the session's options, its stamp, the configs it loaded."""

    def __init__(
        self,
        config: pytest.Config,
        stamp: str,
        *,
        unavailable: dict[str, dict[str, str]] | None = None,
        policy_urls: dict[str, dict[str, str]] | None = None,
    ):
        self.config = config
        self.options = GapOptions.of(config)
        # From xdist's workerinput, not the environment: a session started inside an xdist
        # worker (a test of a pytest plugin, a subprocess) inherits PYTEST_XDIST_WORKER.
        self.worker: str | None = getattr(config, "workerinput", {}).get("workerid")
        self.stamp = stamp
        # What the preflight found, per config path: services down {"llm" | "policies": why},
        # and the urls of the policy servers it started {policy id: url}. The lead finds them;
        # a worker is handed them.
        self.unavailable: dict[str, dict[str, str]] = unavailable or {}
        self.policy_urls: dict[str, dict[str, str]] = policy_urls or {}
        self._loaded: dict[Path, LoadedConfig] = {}
        self._mode_table: ModeTable | None = None

    @property
    def mode_table(self) -> ModeTable:
        """The session's modes and producers, from every `pytest_gap_modes` and
        `pytest_gap_producers` implementation; built on first use, when the conftests of the
        configs' directories are loaded."""
        if self._mode_table is None:
            self._mode_table = session_mode_table(self.config)
        return self._mode_table

    def load(self, path: Path) -> LoadedConfig:
        path = path.resolve()
        if path not in self._loaded:
            loaded = LoadedConfig(path, self)
            for other in self._loaded.values():
                if other.run_dir == loaded.run_dir:
                    raise ConfigError(
                        str(path),
                        [
                            f"output_dir: {other.path} writes to the same run dir "
                            f"({loaded.run_dir.parent}) in this session; give each config its "
                            "own output_dir"
                        ],
                    )
            self._loaded[path] = loaded
        return self._loaded[path]

    def endpoints(self, loaded: LoadedConfig):
        """The policy endpoints this process's trials of `loaded` talk to: a managed server is
        where the lead says it is now (a restart moves it to a new port)."""
        # the policy layer's session side: only a session with trials to run needs it (this
        # package is loaded by every pytest run of the environment, a test suite's too)
        from pytest_gap.servers.registry import endpoints_for
        from pytest_gap.servers.supervisor import live_urls

        started = self.policy_urls.get(str(loaded.path), {})
        if started:
            started = {**started, **live_urls(loaded.run_dir / POLICY_LOGS_DIR)}
        return endpoints_for(loaded.config, started)


class TrialSource(Protocol):
    """How this process's trial items get their results (execution.py): run here, or waited
    for from the Ray cluster that runs them."""

    def result_of(self, item: pytest.Item) -> tuple[TrialResult, bool]:
        """The trial's record, and whether it is an earlier session's (--gap-resume)."""
        ...


SESSION = pytest.StashKey[GapSession]()
TRIALS = pytest.StashKey[TrialSource]()


def pin_devices(worker: str | None, n_workers: int | None) -> None:
    """Give this process its devices, before anything imports the simulator."""
    try:
        pin(os.environ, worker, n_workers)
    except GapError as exc:
        raise pytest.UsageError(str(exc)) from None
