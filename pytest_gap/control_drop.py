"""What a perturbation costs: each perturbed cell against its matched control arm
(control_arms.py), paired by (task, seed), as `gap compare` pairs two policies.

Per cell: both arms' success over the scored pairs, the paired drop (control minus perturbed:
positive when the perturbation hurts) with a 95% interval from the bootstrap that resamples
whole tasks, and McNemar's exact p over the discordant pairs. A pair with an errored trial on
either arm is left out of both and counted. Pure functions over TrialResults.
"""

from __future__ import annotations

from pydantic import BaseModel

from pytest_gap.cells import Cell
from pytest_gap.compare.pairing import Pair
from pytest_gap.compare.stats import row_stats
from pytest_gap.results import TrialResult


class ControlDrop(BaseModel):
    control: str  # the control arm's column in the pivot (family/variation, or a suite name)
    n_pairs: int  # (task, seed) pairs scored on both arms
    n_tasks: int  # tasks among the pairs (the bootstrap resamples them)
    control_rate: float | None  # over the pairs; None without a scored pair
    perturbed_rate: float | None  # the cell's own rate over the same pairs
    drop: float | None  # control_rate - perturbed_rate
    drop_ci_low: float | None  # 95% interval of the drop, resampling tasks
    drop_ci_high: float | None  # 95% interval of the drop, resampling tasks
    p_value: float | None  # McNemar's exact test, two-sided
    n_excluded: int  # pairs left out: an errored trial on either arm

    def text(self) -> str:
        """`0.40 [0.10,0.70] p=0.031 n=10`: the drop, its interval, its p, its pairs."""
        if self.drop is None:
            return f"- n=0 ({self.n_excluded} errored)" if self.n_excluded else "-"
        interval = (
            f" [{self.drop_ci_low:.2f},{self.drop_ci_high:.2f}]"
            if self.drop_ci_low is not None
            else ""
        )
        return f"{self.drop:.2f}{interval} p={self.p_value:.3g} n={self.n_pairs}"


def control_pairs(cell: Cell, control: Cell, results: dict[str, TrialResult]) -> list[Pair]:
    """The recorded (task, seed) episodes both arms ran: A the control, B the perturbed."""
    found = {(t.task_id, t.seed): results.get(t.key) for t in control.trials()}
    pairs = []
    for trial in cell.trials():
        a, b = found.get((trial.task_id, trial.seed)), results.get(trial.key)
        if a is not None and b is not None:
            key = (cell.backend, cell.family, cell.variation, trial.task_id, trial.seed)
            pairs.append(Pair(key=key, a=a, b=b))
    return pairs


def _negated(value: float | None) -> float | None:
    return None if value is None else 0.0 - value  # 0.0 - 0.0 is 0.0, where -0.0 would print


def control_drop(cell: Cell, control: Cell, results: dict[str, TrialResult]) -> ControlDrop:
    stats = row_stats(cell.column, control_pairs(cell, control, results))
    n = stats.n_pairs
    return ControlDrop(
        control=control.column,
        n_pairs=n,
        n_tasks=stats.n_tasks,
        control_rate=stats.a_success / n if n else None,
        perturbed_rate=stats.b_success / n if n else None,
        drop=_negated(stats.diff),
        drop_ci_low=_negated(stats.ci_high),
        drop_ci_high=_negated(stats.ci_low),
        p_value=stats.p_value,
        n_excluded=stats.n_excluded,
    )


def control_drops(cells: list[Cell], results: dict[str, TrialResult]) -> dict[str, ControlDrop]:
    """Each cell with a control arm in `cells` -> its drop (cells keyed by `Cell.key`)."""
    by_key = {c.key: c for c in cells}
    return {
        cell.key: control_drop(cell, by_key[cell.control], results)
        for cell in cells
        if cell.control in by_key
    }
