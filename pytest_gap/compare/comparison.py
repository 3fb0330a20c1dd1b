"""The comparison itself: row B of one run dir against row A of it or of another, refused
with every reason at once (`CompareRefused`) or answered with a verdict and an exit code."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from pytest_gap.compare.controls import control_pairing
from pytest_gap.compare.pairing import RunDir, Side, base_row, pair, select
from pytest_gap.compare.refusals import refusals
from pytest_gap.compare.sequential_ab import ABState, sequential_states
from pytest_gap.compare.stats import ALPHA, RowStats, cell_groups, statistics
from pytest_gap.errors import GapError


class CompareRefused(GapError):
    """The comparison cannot be made; `reasons` holds one line per reason."""

    def __init__(self, reasons: list[str]):
        super().__init__("; ".join(reasons))
        self.reasons = reasons


class Comparison(BaseModel):
    a: Side
    b: Side
    alpha: float
    cells: list[RowStats]
    pooled: RowStats
    only_a: int
    only_b: int
    notes: list[str]
    # --sequential: each cell's anytime-valid reading (sequential_ab.py), which decides the
    # verdict and exit code instead of the McNemar rows
    sequential: list[ABState] | None = None
    margin: float | None = None
    controls: bool = False  # B's perturbed cells against their control arms in A

    @property
    def worse(self) -> list[RowStats]:
        return [r for r in [*self.cells, self.pooled] if r.verdict == "B worse"]

    @property
    def exit_code(self) -> int:
        if self.sequential is not None:
            return 1 if any(s.verdict == "B worse" for s in self.sequential) else 0
        return 1 if self.worse else 0

    def verdict(self) -> str:
        if self.sequential is not None:
            level = f"anytime-valid, alpha {self.alpha}, margin {self.margin:g}"
            worse = [s.line() for s in self.sequential if s.verdict == "B worse"]
            if worse:
                return f"B is worse than A by more than the margin ({level}): {'; '.join(worse)}"
            return f"B is not shown worse than A ({level}): " + "; ".join(
                s.line() for s in self.sequential
            )
        if self.worse:
            where = ", ".join(f"{r.cell} (p_holm={r.p_holm:.3g})" for r in self.worse)
            return f"B is significantly worse than A (Holm, alpha {self.alpha}): {where}"
        return f"B is not significantly worse than A anywhere (Holm, alpha {self.alpha})"

    def to_json(self) -> dict[str, Any]:
        return {
            "a": {"run": self.a.run, "row": self.a.row},
            "b": {"run": self.b.run, "row": self.b.row},
            "alpha": self.alpha,
            "cells": [c.model_dump() for c in self.cells],
            "pooled": self.pooled.model_dump(),
            "unpaired": {"a": self.only_a, "b": self.only_b},
            "notes": self.notes,
            "sequential": [s.model_dump() for s in self.sequential]
            if self.sequential is not None
            else None,
            "margin": self.margin,
            "controls": self.controls,
            "verdict": self.verdict(),
            "exit_code": self.exit_code,
        }


def compare(
    run_a: RunDir,
    run_b: RunDir | None,
    row_a: str | None,
    row_b: str | None,
    *,
    allow_harness_mismatch: bool = False,
    alpha: float = ALPHA,
    sequential: tuple[float, int] | None = None,
    controls: bool = False,
) -> Comparison:
    """Compare row B with row A: of one run (`run_b` None) or of two. Raises CompareRefused.
    `sequential` (margin, block seeds): read each cell as an anytime-valid sequential test.
    `controls`: B's perturbed cells against their declared control arms in A (controls.py);
    in one run A and B may be one row (the default when only one is named)."""
    if controls and run_b is None:
        row_a = row_a or row_b
        row_b = row_b or row_a
    elif run_b is None and (row_a is None or row_b is None):
        raise GapError(
            f"{run_a.path}: comparing two rows of one run needs both --a ROW and --b ROW "
            "(or give two run dirs)"
        )
    a = select(run_a, row_a, "--a")
    b = select(run_b or run_a, row_b, "--b")
    if run_b is None and not controls and base_row(a.row) == base_row(b.row):
        raise GapError(f"--a and --b name the same row {a.row}; name two rows of the run")
    pairing, reasons = control_pairing(a, b) if controls else (pair(a, b), [])
    notes: list[str] = []
    if not reasons:
        reasons, notes = refusals(
            pairing, run_a, run_b, allow_harness_mismatch=allow_harness_mismatch, controls=controls
        )
    if reasons:
        raise CompareRefused(reasons)
    cells, pooled = statistics(pairing.pairs, alpha)
    for name, count in (("A", pairing.only_a), ("B", pairing.only_b)):
        if count:
            other = "B" if name == "A" else "A"
            notes.append(f"{count} trials of {name} have no partner in {other}: not compared")
    for row in [*cells, pooled]:
        if row.n_tasks == 1 and row.n_pairs > 1 and row.cell != "pooled":
            notes.append(f"{row.cell}: one task, so its interval resamples seeds, not tasks")
    states = None
    if sequential is not None:
        margin, block_seeds = sequential
        states = sequential_states(cell_groups(pairing.pairs), margin, alpha, block_seeds)
    return Comparison(
        a=a,
        b=b,
        alpha=alpha,
        cells=cells,
        pooled=pooled,
        only_a=pairing.only_a,
        only_b=pairing.only_b,
        notes=notes,
        sequential=states,
        margin=sequential[0] if sequential is not None else None,
        controls=controls,
    )
