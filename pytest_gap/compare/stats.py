"""The paired statistics, per cell and pooled: success of each side, McNemar's exact test, a
task-resampling bootstrap interval for the difference, and Holm's adjustment over the rows
(see the package docstring for what each means and why).

scipy and statsmodels are imported inside the functions that use them (seconds to import).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from pytest_gap.compare.pairing import Pair
from pytest_gap.intervals import CONFIDENCE, cluster_bootstrap

ALPHA = 0.05


def mcnemar_p(a_only: int, b_only: int) -> float:
    """McNemar's exact test, two-sided: the discordant pairs split 50/50 under no difference."""
    if a_only + b_only == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(a_only, a_only + b_only, 0.5).pvalue)


def cluster_interval(
    groups: Sequence[Sequence[float]], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """Percentile bootstrap interval for the mean of every value in `groups` (here: per-pair
    differences B - A, one group per task), resampling whole tasks; intervals.cluster_bootstrap."""
    return cluster_bootstrap(groups, confidence)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (statsmodels), in the order given."""
    if not pvalues:
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(list(pvalues), alpha=ALPHA, method="holm")[1]]


Verdict = Literal["B worse", "B better", "n.s.", "-"]


class RowStats(BaseModel):
    """One row of the table: a cell (family/variation), or `pooled` over every pair."""

    cell: str
    n_pairs: int  # scored pairs (neither trial errored)
    n_tasks: int
    a_success: int
    b_success: int
    diff: float | None  # B - A
    ci_low: float | None
    ci_high: float | None
    a_only: int  # discordant: A succeeded, B did not
    b_only: int  # discordant: B succeeded, A did not
    p_value: float | None
    p_holm: float | None = None
    n_excluded: int  # pairs left out: an errored trial on either side
    n_infra: int  # of those, pairs with an infrastructure failure
    verdict: Verdict = "-"


def row_stats(cell: str, pairs: list[Pair]) -> RowStats:
    scored = [p for p in pairs if not p.excluded]
    excluded = [p for p in pairs if p.excluded]
    tasks: dict[tuple, list[float]] = {}
    for p in scored:
        tasks.setdefault(p.task, []).append(float(p.b.success) - float(p.a.success))
    a_only = sum(p.a.success and not p.b.success for p in scored)
    b_only = sum(p.b.success and not p.a.success for p in scored)
    interval = cluster_interval(list(tasks.values()))
    n = len(scored)
    return RowStats(
        cell=cell,
        n_pairs=n,
        n_tasks=len(tasks),
        a_success=sum(p.a.success for p in scored),
        b_success=sum(p.b.success for p in scored),
        diff=(b_only - a_only) / n if n else None,
        ci_low=interval[0] if interval else None,
        ci_high=interval[1] if interval else None,
        a_only=a_only,
        b_only=b_only,
        p_value=mcnemar_p(a_only, b_only) if n else None,
        n_excluded=len(excluded),
        n_infra=sum(p.a.infra_failure or p.b.infra_failure for p in excluded),
    )


def cell_groups(pairs: list[Pair]) -> dict[str, list[Pair]]:
    """The pairs of each cell (family/variation; `backend:family/variation` when the pairs
    span several backends), by the cell's label, in the order the pairs come."""
    by_cell: dict[tuple, list[Pair]] = {}
    for p in pairs:
        by_cell.setdefault(p.key[:3], []).append(p)
    several = len({backend for backend, _, _ in by_cell}) > 1  # then the label names it
    return {
        f"{backend}:{found[0].cell}" if several else found[0].cell: found
        for (backend, _, _), found in by_cell.items()
    }


def statistics(pairs: list[Pair], alpha: float = ALPHA) -> tuple[list[RowStats], RowStats]:
    """(per-cell rows, pooled row), with Holm-adjusted p-values and verdicts filled."""
    cells = [row_stats(label, found) for label, found in cell_groups(pairs).items()]
    pooled = row_stats("pooled", pairs)
    family = [c for c in cells if c.p_value is not None]
    if len(cells) > 1 and pooled.p_value is not None:
        family.append(pooled)
    for row, adjusted in zip(family, holm([r.p_value for r in family]), strict=True):
        row.p_holm = adjusted
    if len(cells) == 1:
        pooled.p_holm = cells[0].p_holm
    for row in [*cells, pooled]:
        if row.p_holm is None or row.diff is None:
            continue
        if row.p_holm >= alpha or row.diff == 0:
            row.verdict = "n.s."
        else:
            row.verdict = "B worse" if row.diff < 0 else "B better"
    return cells, pooled
