"""The in-session sequential A/B test: `compare: {a: ID, b: ID, rule: sequential, margin: M}` in a
grid whose policy axis lists both.

Each (mode, family, variation) cell of policy A is paired with B's (`Cell.ab_pair`): the two
run the same tasks and seeds, block by block and together (block 1 of A, block 1 of B, block 2
of A, ...; plugin/collect.py, and the xdist and Ray schedulers take turns by pair). After each
block both arms have recorded, the pairs so far are read as `gap compare --sequential` reads
them (compare/sequential_ab.py): B worse (more than `margin` below A), B better, or B not worse
(within the margin), each at alpha split evenly across the pairs. Once a pair is decided, or
its plan is spent, neither arm's remaining trials are run: they are skipped as not needed and
counted so in coverage, as under `gate_rule: sequential`.

The session's gate is the A/B verdict: FAIL where B is worse than A by more than the margin,
PASS otherwise (the threshold is not read); errored cells and missing trials fail it as ever.
Cells of other policies run and are summarised as usual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from pytest_gap.cells import Cell
from pytest_gap.compare.pairing import Pair
from pytest_gap.compare.sequential_ab import ABState, decide
from pytest_gap.config.model import ABCompare
from pytest_gap.results import TrialResult, recorded_results
from pytest_gap.sequential import alpha_per_cell

if TYPE_CHECKING:
    from pathlib import Path


class ABOutcome(BaseModel):
    """The gate's reading of an A/B session: each pair's state by its label."""

    a: str
    b: str
    margin: float
    alpha: float
    states: dict[str, ABState] = {}

    def reasons(self) -> list[str]:
        worse = [s.line() for s in self.states.values() if s.verdict == "B worse"]
        if not worse:
            return []
        return [f"{self.b} is worse than {self.a} by more than the margin: {'; '.join(worse)}"]

    def notes(self) -> list[str]:
        found = [s.line() for s in self.states.values() if s.verdict != "B worse"]
        return [f"{self.b} against {self.a}: {'; '.join(found)}"] if found else []


def arms(cells: list[Cell], settings: ABCompare) -> dict[str, tuple[Cell, Cell]]:
    """The runnable A/B pairs of `cells`: (A's cell, B's cell) by pair label."""
    found: dict[str, dict[str, Cell]] = {}
    for cell in cells:
        if cell.ab_pair and cell.error is None:
            side = "a" if cell.policy_id == settings.a else "b"
            found.setdefault(cell.ab_pair, {})[side] = cell
    return {
        f"{pair['a'].mode} {pair['a'].column}": (pair["a"], pair["b"])
        for pair in found.values()
        if set(pair) == {"a", "b"}
    }


def pair_state(
    label: str,
    cell_a: Cell,
    cell_b: Cell,
    results: dict[str, TrialResult],
    settings: ABCompare,
    alpha: float,
) -> ABState:
    """The pair's state from `results` (keyed by trial dir): its blocks both arms completed."""
    complete: list[list[Pair]] = []
    for block_a, block_b in zip(cell_a.blocks(), cell_b.blocks(), strict=True):
        found_a = [results.get(t.key) for t in block_a]
        found_b = {(t.task_id, t.seed): results.get(t.key) for t in block_b}
        if any(r is None for r in found_a) or any(r is None for r in found_b.values()):
            break
        complete.append(
            [
                Pair(
                    key=(a.backend, a.family, a.variation, a.task_id, a.seed),
                    a=a,
                    b=found_b[(a.task_id, a.seed)],
                )
                for a in found_a
            ]
        )
    n_pairs = sum(not p.excluded for block in complete for p in block)
    return decide(
        label,
        complete,
        settings.margin,
        alpha,
        n_pairs=n_pairs,
        planned=len(cell_a.trials()),
        last_block=len(cell_a.blocks()),
    )


def outcome(
    cells: list[Cell], results: dict[str, TrialResult], settings: ABCompare
) -> tuple[ABOutcome, frozenset[str]]:
    """The gate's reading, and the keys of the cells no longer needed (both arms of a pair
    that is decided or spent)."""
    pairs = arms(cells, settings)
    share = alpha_per_cell(settings.alpha, len(pairs))
    states, stopped = {}, set()
    for label, (cell_a, cell_b) in pairs.items():
        states[label] = pair_state(label, cell_a, cell_b, results, settings, share)
        if states[label].stopped:
            stopped |= {cell_a.key, cell_b.key}
    found = ABOutcome(
        a=settings.a, b=settings.b, margin=settings.margin, alpha=settings.alpha, states=states
    )
    return found, frozenset(stopped)


def recorded_pair_state(
    run_dir: Path, cell: Cell, cells: list[Cell], settings: ABCompare
) -> ABState | None:
    """The state of `cell`'s pair as the run dir records it now (every process reads it before
    each trial); None when `cell` is in no runnable pair."""
    pairs = arms(cells, settings)
    for label, (cell_a, cell_b) in pairs.items():
        if cell.key in (cell_a.key, cell_b.key):
            keys = [t.key for t in (*cell_a.trials(), *cell_b.trials())]
            results = recorded_results(run_dir, keys)
            share = alpha_per_cell(settings.alpha, len(pairs))
            return pair_state(label, cell_a, cell_b, results, settings, share)
    return None
