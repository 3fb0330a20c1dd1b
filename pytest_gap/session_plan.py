"""A benchmark config as a session plans it: the config, its plan digest, its cells, its trials.

Shared by the two pytest sessions that plan a config: a benchmark session (the plugin's
`LoadedConfig` adds the run dir and the services its preflight found down) and `gap merge`'s
(scale/merge_session.py, which must plan the merged config exactly as the sessions it merges
did). Both take the mode table from the session's `pytest_gap_modes` / `pytest_gap_producers`
implementations (`session_mode_table`), so a conftest's or plugin's modes count in either.

No pytest here: a session hands in its `pytest.Config` (its hooks and options are used).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_gap.baseline import baseline_of
from pytest_gap.config.document import load_config
from pytest_gap.modes import ModeTable
from pytest_gap.plan import plan
from pytest_gap.provenance import plan_digest


def session_mode_table(config: Any) -> ModeTable:
    """The session's modes and producers, from every `pytest_gap_modes` and
    `pytest_gap_producers` implementation of the pytest session `config` (a pytest.Config)."""
    hook = config.hook
    return ModeTable.of(
        hook.pytest_gap_modes(config=config), hook.pytest_gap_producers(config=config)
    )


def session_selection(config: Any) -> dict[str, Any]:
    """What of the session's command line plans a config (`SessionPlan`'s keywords): its
    --gap-families and --gap-modes (repeatable, comma-separated), --gap-frames and
    --gap-baseline."""
    baseline = config.getoption("gap_baseline", None)
    return {
        "families": split_csv(config.getoption("gap_families")),
        "modes": split_csv(config.getoption("gap_modes")),
        "frames_every": config.getoption("gap_frames"),
        "baseline": Path(baseline).resolve() if baseline else None,
    }


def split_csv(values: list[str] | None) -> list[str] | None:
    """The values of a repeatable comma-separated option (`--gap-modes a,b --gap-modes c`)."""
    if not values:
        return None
    return [v for value in values for v in value.split(",") if v]


class SessionPlan:
    """One benchmark YAML planned: every cell (`all_cells`, what the summary folds over), the
    cells selected by `families` / `modes` (`cells`, what is collected), every trial by id."""

    def __init__(
        self,
        path: Path,
        mode_table: ModeTable,
        *,
        families: list[str] | None = None,
        modes: list[str] | None = None,
        frames_every: int | None = None,
        baseline: Path | None = None,
    ):
        self.path = path
        table = mode_table
        self.config = baseline_of(load_config(path, mode_table=table), baseline)
        if frames_every is not None:  # --gap-frames overrides trials.frames_every
            self.config.trials.frames_every = frames_every
        self.plan_digest = plan_digest(self.config)
        self.all_cells = plan(self.config, mode_table=table)
        self.cells = (
            plan(self.config, families=families, modes=modes, mode_table=table)
            if families or modes
            else self.all_cells
        )
        self.trials = {t.id: t for cell in self.all_cells for t in cell.trials()}

    def mark_unavailable(self, services: dict[str, str]) -> None:
        """Error the cells that need a service the controller's preflight found down."""
        if services:
            self.all_cells = [cell.unavailable(services) for cell in self.all_cells]
            self.cells = [cell.unavailable(services) for cell in self.cells]
            self.trials = {t.id: t for cell in self.all_cells for t in cell.trials()}
