"""`gap compare --sequential`: the paired A/B test read as an anytime-valid sequential test, so
two arms may be compared while they still run (or were stopped early) and looked at as often as
one likes, at a stated error rate.

Per cell, the scored pairs are taken in blocks (`block_seeds` seeds of every task, in seed
order, as a session runs them), and after each complete block three e-values of the pairs so
far are read (noninferiority.py), each against 1/alpha_cell (alpha split evenly across the
cells):
- "B worse": against "B is at most `margin` worse than A";
- "B better": against "B is no better than A";
- "B not worse": against "B is worse than A by `margin` or more".
The first to cross decides the cell, in that order at one look; a cell none decided by its last
complete block is "undecided". Only B worse exits 1. A block is complete when every task of the
cell has its pairs of those seeds (an errored pair completes a block and is no observation, as
it is in no rate); the pairs after the first incomplete block are not read.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel

from pytest_gap.compare.noninferiority import log_e_within, log_e_worse
from pytest_gap.compare.pairing import Pair

ABVerdict = Literal["B worse", "B better", "B not worse", "undecided"]


class ABState(BaseModel):
    """Where one cell's sequential comparison stands."""

    cell: str
    verdict: ABVerdict
    n: int  # scored pairs read when it was decided (or at its last complete block)
    n_pairs: int  # scored pairs recorded
    looks: int
    a_only: int
    b_only: int
    alpha: float  # the cell's share of the level
    log_e_worse: float
    log_e_better: float
    log_e_not_worse: float
    planned: int = 0  # in a session: the pairs its plan holds (0: read from records alone)
    spent: bool = False  # in a session: undecided with every block looked at

    @property
    def decided(self) -> bool:
        return self.verdict != "undecided"

    @property
    def stopped(self) -> bool:
        """No more of the pair's trials are needed (decided, or every block run)."""
        return self.decided or self.spent

    def line(self) -> str:
        """`libero/object: B worse at n=20 of 50 pairs (A only 9, B only 0)`."""
        of = f"{self.planned} planned pairs" if self.planned else f"{self.n_pairs} pairs"
        return (
            f"{self.cell}: {self.verdict} at n={self.n} of {of} "
            f"(A only {self.a_only}, B only {self.b_only})"
        )


def blocks(pairs: list[Pair], block_seeds: int) -> list[list[Pair]]:
    """A cell's pairs in blocks of `block_seeds` seeds of every task, up to the first block
    some task does not complete."""
    by_task: dict[tuple, list[Pair]] = {}
    for p in sorted(pairs, key=lambda p: (p.task, p.key[4])):
        by_task.setdefault(p.task, []).append(p)
    longest = max((len(found) for found in by_task.values()), default=0)
    out = []
    for start in range(0, longest, block_seeds):
        block = [p for found in by_task.values() for p in found[start : start + block_seeds]]
        sizes = {len(found[start : start + block_seeds]) for found in by_task.values()}
        if len(sizes) != 1:  # a task has fewer of these seeds than another: not complete
            break
        out.append(block)
    return out


def cell_state(
    cell: str, pairs: list[Pair], margin: float, alpha: float, block_seeds: int
) -> ABState:
    """Read `pairs` (one cell's) block by block until a look decides."""
    n_pairs = sum(not p.excluded for p in pairs)
    return decide(cell, blocks(pairs, block_seeds), margin, alpha, n_pairs=n_pairs)


def decide(
    cell: str,
    looks_at: list[list[Pair]],
    margin: float,
    alpha: float,
    *,
    n_pairs: int,
    planned: int = 0,
    last_block: int | None = None,
) -> ABState:
    """Look at the complete blocks `looks_at` in order until one decides; `planned` and
    `last_block` (the plan's number of blocks) say, in a session, when the plan is spent."""
    bar = math.log(1 / alpha)
    a_only = b_only = n = looks = 0
    verdict: ABVerdict = "undecided"
    worse = better = not_worse = 0.0
    for looks, block in enumerate(looks_at, 1):  # noqa: B007
        for p in block:
            if p.excluded:
                continue
            n += 1
            a_only += p.a.success and not p.b.success
            b_only += p.b.success and not p.a.success
        worse = log_e_worse(a_only, b_only, n, margin)
        better = log_e_within(a_only, b_only, n, 0.0)
        not_worse = log_e_within(a_only, b_only, n, margin)
        if worse >= bar:
            verdict = "B worse"
        elif better >= bar:
            verdict = "B better"
        elif not_worse >= bar:
            verdict = "B not worse"
        if verdict != "undecided":
            break
    return ABState(
        cell=cell,
        verdict=verdict,
        n=n,
        n_pairs=n_pairs,
        looks=looks,
        planned=planned,
        spent=verdict == "undecided" and last_block is not None and looks == last_block,
        a_only=a_only,
        b_only=b_only,
        alpha=alpha,
        log_e_worse=worse,
        log_e_better=better,
        log_e_not_worse=not_worse,
    )


def sequential_states(
    by_cell: dict[str, list[Pair]], margin: float, alpha: float, block_seeds: int
) -> list[ABState]:
    """Every cell's state, at `alpha` split evenly across the cells."""
    share = alpha / max(1, len(by_cell))
    return [cell_state(c, found, margin, share, block_seeds) for c, found in by_cell.items()]
