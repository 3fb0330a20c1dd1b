"""The sequential gate's statistics: anytime-valid decisions on a cell's success rate, pure
functions over its records.

Under `gate_rule: sequential` each cell is asked "is its success rate at least the threshold
θ?", and answered as soon as its records say so at level α_cell, however often they are
looked at, instead of after every planned trial.

- Evidence: two e-processes, one per side of θ. For "above", the likelihood ratio of a success
  rate p against θ, (p/θ)^S ((1-p)/(1-θ))^F after S successes and F failures, averaged over a
  Beta(a, b) prior restricted to p > θ (closed form: `log_e_value`); "below" restricts it to
  p < θ. Each ratio with p > θ has expectation at most 1 on every trial whose own rate is at
  most θ, so while the cell's rate is at most θ the mixture is a nonnegative supermartingale and,
  by Ville's inequality, reaches 1/α_cell with probability at most α_cell, at any stopping time.
  PASS when "above" reaches it, FAIL when "below" does.
- Looks: after whole blocks (`Cell.blocks`: k seeds of every task of the cell). A cell's rate
  is the task-balanced rate, and its tasks differ: a block holds the same number of trials of
  every task, so the product over a block has expectation prod_t (1 + c (p_t - θ)) <=
  (1 + c mean_t(p_t - θ))^T (AM-GM) <= 1 whenever the task-balanced rate is at most θ. The
  process read at block ends is a supermartingale for that rate; read mid-block it is not, so a
  block is looked at only when every trial of it has a record.
- Level: α split evenly across the config's cells (`alpha_per_cell`, Bonferroni): the config
  passes only when every cell passes, so each cell's false PASS is bounded by α / cells and the
  config's by α.
- Errored trials (infrastructure failures, config errors) are no observation of the policy:
  they complete their block but add nothing to S or F, as they stay out of the rates.

scipy.special (betaln, betainc) is imported on first use: a session that does not gate
sequentially never pays for it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from pytest_gap.cells import Cell
from pytest_gap.config.model import SequentialGate
from pytest_gap.results import TrialResult, recorded_results

Side = Literal["above", "below"]
SequentialVerdict = Literal["PASS", "FAIL", "UNDECIDED"]

# The mixture's prior on the success rate before it is restricted to one side of the
# threshold θ: an even mix of Beta(c θ, c (1 - θ)) for each c here, all centred on θ. The
# concentrated one puts its mass on rates a few points from θ, the differences a benchmark is
# run to see (power at the full plan); the flat one on rates far from it (a policy that always
# or never succeeds is decided in a few trials). bench/sequential.py measures the choice
# against the fixed-n design.
PRIOR_STRENGTHS = (2.0, 30.0)
DEFAULT_ALPHA = 0.05


def log_e_value(successes, trials: int, threshold: float, side: Side):
    """log of the mixture likelihood ratio for a success rate `side` of `threshold`
    (0 < threshold < 1) after `successes` (a count, or a numpy array of counts) of `trials`:
    see the module's docstring. 0 with no trial; -inf where that side is ruled out."""
    import numpy as np
    from scipy.special import logsumexp

    parts = [_log_e_beta(successes, trials, threshold, side, c) for c in PRIOR_STRENGTHS]
    return (logsumexp(np.stack(parts), axis=0) - math.log(len(parts)))[()]


def _log_e_beta(successes, trials: int, threshold: float, side: Side, strength: float):
    """The mixture over one Beta(strength θ, strength (1 - θ)) prior, restricted to `side`."""
    import numpy as np
    from scipy.special import betainc, betaincc, betaln

    s = np.asarray(successes, dtype=float)
    if trials == 0:
        return np.zeros_like(s)
    a, b = strength * threshold, strength * (1.0 - threshold)
    f = trials - s
    tail = betaincc if side == "above" else betainc  # the prior's mass on that side, and after
    with np.errstate(divide="ignore"):
        log_mass = np.log(tail(a + s, b + f, threshold)) - math.log(tail(a, b, threshold))
    log_null = s * math.log(threshold) + f * math.log(1.0 - threshold)
    return betaln(a + s, b + f) - betaln(a, b) + log_mass - log_null


def boundaries(
    sizes: list[int], threshold: float, alpha: float, *, final: bool
) -> list[tuple[int, int]]:
    """For looks after blocks of `sizes` scored trials: per look, the least success count
    that PASSes and the most that FAILs (n + 1 and -1: none does).

    Looks before the last read the e-values against 1/alpha (anytime-valid). With `final`, the
    last look is the cell's last (its plan, or its cap, is spent): it spends the level the
    looks before it left unspent, as an exact binomial test of the success count given that no
    earlier look decided (`_final_look`), so that the cell's power at its full plan is close
    to a fixed-n test's. Threshold 0 passes at the first look with a scored trial; threshold
    1 never passes and fails on the first failure."""
    import numpy as np

    bars, n = [], 0
    for size in sizes:
        n += size
        if threshold <= 0.0:
            bars.append((0 if n else 1, -1))
        elif threshold >= 1.0:
            bars.append((n + 1, n - 1))
        else:
            counts = np.arange(n + 1)
            above = np.nonzero(log_e_value(counts, n, threshold, "above") >= math.log(1 / alpha))
            below = np.nonzero(log_e_value(counts, n, threshold, "below") >= math.log(1 / alpha))
            bars.append(
                (
                    int(above[0][0]) if len(above[0]) else n + 1,
                    int(below[0][-1]) if len(below[0]) else -1,
                )
            )
    if final and sizes and 0.0 < threshold < 1.0:
        bars[-1] = _final_look(sizes, bars[:-1], threshold, alpha)
    return bars


def _final_look(
    sizes: list[int], earlier: list[tuple[int, int]], threshold: float, alpha: float
) -> tuple[int, int]:
    """The last look's counts: the least c with P(an earlier look PASSed) + P(none decided
    and S >= c) <= alpha, and the greatest with the same for FAIL, for trials at exactly the
    threshold (the null's boundary, where a false decision is likeliest). Computed exactly by
    carrying the count's distribution from look to look."""
    import numpy as np
    from scipy.special import gammaln

    def binomial(size: int) -> np.ndarray:
        k = np.arange(size + 1)
        log_pmf = (
            gammaln(size + 1)
            - gammaln(k + 1)
            - gammaln(size - k + 1)
            + k * math.log(threshold)
            + (size - k) * math.log(1 - threshold)
        )
        return np.exp(log_pmf)

    dist = np.ones(1)
    spent_pass = spent_fail = 0.0
    for size, (pass_at, fail_at) in zip(sizes, earlier, strict=False):
        dist = np.convolve(dist, binomial(size))
        spent_pass += dist[pass_at:].sum()
        spent_fail += dist[: fail_at + 1].sum()
        dist[pass_at:] = 0.0
        dist[: fail_at + 1] = 0.0
    dist = np.convolve(dist, binomial(sizes[-1]))
    n = len(dist) - 1
    at_least = np.cumsum(dist[::-1])[::-1]  # P(no earlier decision and S >= c)
    at_most = np.cumsum(dist)  # P(no earlier decision and S <= c)
    passing = np.nonzero(spent_pass + at_least <= alpha)[0]
    failing = np.nonzero(spent_fail + at_most <= alpha)[0]
    return (
        int(passing[0]) if len(passing) else n + 1,
        int(failing[-1]) if len(failing) else -1,
    )


def alpha_per_cell(alpha: float, cells: int) -> float:
    """Each cell's level when a config's `cells` share `alpha` (Bonferroni)."""
    return alpha / max(1, cells)


class Block(BaseModel):
    """One block of a cell's trials as its records stand."""

    complete: bool  # every trial of the block has a record
    successes: int  # scored trials that succeeded
    scored: int  # trials neither errored nor missing


class SequentialState(BaseModel):
    """Where a cell stands under the sequential gate."""

    verdict: SequentialVerdict  # PASS, FAIL, or UNDECIDED so far
    alpha: float  # the cell's level
    n: int  # scored trials of the blocks looked at
    successes: int  # of those, successes
    planned: int  # the cell's planned trials
    looks: int  # blocks looked at (each complete, in order)
    decided_at: int | None = None  # n when the verdict was reached
    spent: bool = False  # UNDECIDED with every block looked at (or the cap reached)
    # At the last look: the least success count that would have passed, the most that would
    # have failed (None before any look).
    pass_at: int | None = None
    fail_at: int | None = None  # at the last look: the most successes that would have failed

    @property
    def decided(self) -> bool:
        return self.verdict != "UNDECIDED"

    @property
    def stopped(self) -> bool:
        """No more of its trials are needed: decided, or undecided at its cap."""
        return self.decided or self.spent

    def line(self) -> str:
        """`PASS at n=20 of 50 planned` / `undecided at n=50 of 50 planned`."""
        what = self.verdict if self.decided else "undecided"
        return f"{what} at n={self.n} of {self.planned} planned"


def decide(
    blocks: list[Block],
    threshold: float,
    alpha: float,
    *,
    planned: int,
    cap: int | None = None,
) -> SequentialState:
    """Look at `blocks` in order, each once it is complete, and stop at the first look that
    decides (`boundaries`), at the first incomplete block, or at the last look: the plan's last
    block, or the first whose scored trials reach `cap` (undecided there: `spent`)."""
    looked: list[Block] = []
    for block in blocks:
        if not block.complete:
            break
        looked.append(block)
        if cap is not None and sum(b.scored for b in looked) >= cap:
            break
    last = len(looked) == len(blocks) or (cap is not None and sum(b.scored for b in looked) >= cap)
    sizes = [b.scored for b in looked]
    bars = boundaries(sizes, threshold, alpha, final=last)
    n = successes = 0
    for look, (block, (pass_at, fail_at)) in enumerate(zip(looked, bars, strict=True), 1):
        n += block.scored
        successes += block.successes
        verdict: SequentialVerdict | None = (
            "PASS" if successes >= pass_at else "FAIL" if successes <= fail_at else None
        )
        if verdict is not None or look == len(looked):
            return SequentialState(
                verdict=verdict or "UNDECIDED",
                alpha=alpha,
                n=n,
                successes=successes,
                planned=planned,
                looks=look,
                decided_at=n if verdict else None,
                spent=verdict is None and last,
                pass_at=pass_at,
                fail_at=fail_at,
            )
    return SequentialState(
        verdict="UNDECIDED", alpha=alpha, n=0, successes=0, planned=planned, looks=0, spent=last
    )


def cell_state(
    cell: Cell,
    results: dict[str, TrialResult],
    threshold: float,
    alpha: float,
    cap: int | None = None,
) -> SequentialState:
    """`decide` over `cell`'s blocks as `results` (keyed by trial dir) record them."""
    blocks = []
    for trials in cell.blocks():
        found = [results.get(t.key) for t in trials]
        scored = [r for r in found if r is not None and not r.errored]
        blocks.append(
            Block(
                complete=all(r is not None for r in found),
                successes=sum(r.success for r in scored),
                scored=len(scored),
            )
        )
    return decide(blocks, threshold, alpha, planned=len(cell.trials()), cap=cap)


def recorded_state(
    run_dir: Path, cell: Cell, cells: list[Cell], threshold: float, settings: SequentialGate
) -> SequentialState:
    """`cell`'s state from the records in `run_dir` now (each process reads them itself, so
    an xdist worker or the single process sees a decision before it starts its next trial).
    `cells`: the config's cells, which share its level."""
    results = recorded_results(run_dir, (t.key for t in cell.trials()))
    alpha = alpha_per_cell(settings.alpha, sum(c.error is None for c in cells))
    return cell_state(cell, results, threshold, alpha, settings.max_trials)
