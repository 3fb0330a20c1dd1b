"""The decisions that share a config's level across its cells (Bonferroni) or adjust their
p-values across them (Holm), on configs of several cells. Every other test of these rules runs
one cell, where a split is a no-op: a rule that used the whole level there would pass them all.

Each answer is computed here from first principles, never read from the code under test: the
sequential gate's e-value as the integral it is defined by (scipy's quad), the paired tests'
betting e-values as products over the pairs, Tango's p-value from its constrained likelihood
maximum (scipy's minimize_scalar), Holm's adjustment from statsmodels' multipletests. Each case
is one where the cell's share decides at another look than the whole level would (the test
checks that first), and each rule is read where a session reads it (the records in the run dir,
`recorded_state`) and where the summary does (the fold).
"""

from __future__ import annotations

import math

import pytest
from scipy.integrate import quad
from statsmodels.stats.multitest import multipletests

from pytest_gap import ab_gate, baseline
from pytest_gap.baseline import Baseline
from pytest_gap.compare.noninferiority import BETS
from pytest_gap.compare.pairing import RunDir
from pytest_gap.config import parse_config
from pytest_gap.config.model import ABCompare, BaselineGate
from pytest_gap.plan import plan
from pytest_gap.report import fold_run
from pytest_gap.results import recorded_results, write_result
from pytest_gap.sequential import PRIOR_STRENGTHS, recorded_state
from tests.fake_session import BACKEND, FakeSession
from tests.stat_references import tango_p_by_likelihood
from tests.test_report import ROOT, _result

pytest_plugins = ["pytester"]

ALPHA = 0.05  # every rule's default level
MARGIN = 0.05  # the paired rules' default margin
BLOCK = 4  # trials per block: 2 seeds of each of 2 tasks
VARIATIONS = ("object", "spatial", "goal")  # three cells per policy


def _grid(policies=("p",), **extra) -> dict:
    """Three cells per policy (libero object, spatial, goal), 2 tasks x 20 seeds each: ten
    blocks of four trials."""
    benchmark = {
        "families": ["libero"],
        "variations": list(VARIATIONS),
        "modes": ["policy_only"],
        "policies": list(policies),
        "task_ids": [0, 1],
        "n_seeds": 20,
        "mode_overrides": {"policy_only": {"template": "policy_only"}},
    }
    top = {k: v for k, v in extra.items() if k in ("gate", "compare")}
    benchmark |= {k: v for k, v in extra.items() if k not in top}
    policy_urls = {p: {"url": f"ws://h:{i + 1}"} for i, p in enumerate(policies)}
    return {"benchmark": benchmark, "policies": policy_urls, **top}


def _cells(data: dict, errored: bool):
    """The grid's cells; with `errored`, the last one errored (a service it needs was down),
    which is no cell of the level's split."""
    cells = plan(parse_config(data, "grid.yaml", base=ROOT))
    if errored:
        cells[-1] = cells[-1].model_copy(update={"error": "policy server down"})
    return cells


def _first_look(evidence: list[float], bar: float) -> int | None:
    """The first look (1-based) whose e-value reaches `bar`."""
    return next((look for look, e in enumerate(evidence, 1) if e >= bar), None)


# -- answers from first principles ----------------------------------------------------------------
def _e_above(successes: int, n: int, threshold: float) -> float:
    """The sequential gate's e-value for a rate above `threshold`: the likelihood ratio of p
    against the threshold, averaged over each prior Beta(c θ, c (1 - θ)) restricted to p > θ,
    the priors mixed evenly; integrated numerically (the prior's singularity at 1 goes to quad's
    algebraic weight)."""
    mixed = []
    for c in PRIOR_STRENGTHS:
        a, b = c * threshold, c * (1 - threshold)

        def prior(p, a=a):
            return p ** (a - 1)

        def ratio(p):
            return (p / threshold) ** successes * ((1 - p) / (1 - threshold)) ** (n - successes)

        def integral(f, b=b):
            return quad(f, threshold, 1, weight="alg", wvar=(0.0, b - 1), limit=200)[0]

        mixed.append(integral(lambda p, prior=prior: prior(p) * ratio(p)) / integral(prior))
    return sum(mixed) / len(mixed)


def _e_paired(differences: list[int], margin: float, side: str) -> float:
    """The betting e-value over paired differences D = B - A in {-1, 0, 1}: the product over
    the pairs of 1 - λ (D + margin) ("worse": betting that B falls short by more than the
    margin) or 1 + λ (D + margin) ("within"), mixed evenly over the bets λ = bet / (1 ± margin)."""
    sign = -1 if side == "worse" else 1
    values = []
    for bet in BETS:
        lam = bet / (1 + margin) if side == "worse" else bet / (1 - margin)
        values.append(math.prod(1 + sign * lam * (d + margin) for d in differences))
    return sum(values) / len(values)


# -- the sequential gate --------------------------------------------------------------------------
THRESHOLD = 0.7  # where four successes a block decide a cell at another look for each share


@pytest.mark.parametrize("errored", [False, True], ids=["three_cells", "one_of_three_errored"])
def test_the_sequential_gate_reads_each_cell_at_its_share_of_the_level(tmp_path, errored):
    """A cell that succeeds every trial, in a config of three cells (one of them errored, in
    the second case): it passes at the first look whose e-value reaches cells/alpha, the
    runnable cells counted, both where a session reads it before each trial (the run dir's
    records) and in the fold."""
    data = _grid(gate_threshold=THRESHOLD, gate_rule="sequential", sequential={"block_seeds": 2})
    cells = _cells(data, errored)
    runnable = 2 if errored else 3
    cell = cells[0]
    assert [len(b) for b in cell.blocks()] == [BLOCK] * 10
    evidence = [_e_above(BLOCK * look, BLOCK * look, THRESHOLD) for look in range(1, 11)]
    decided = _first_look(evidence, runnable / ALPHA)
    # the level that a rule which did not split it, or split it over the errored cell too,
    # would read: it would decide at another look
    wrong = 1 / ALPHA if not errored else len(cells) / ALPHA
    assert decided is not None and decided < 10
    assert _first_look(evidence, wrong) != decided, evidence

    settings = parse_config(data, "grid.yaml", base=ROOT).sequential_gate
    run_dir = tmp_path / "run"
    for block in cell.blocks()[: decided - 1]:
        for trial in block:
            write_result(run_dir / trial.key, _result(trial, success=True))
    before = recorded_state(run_dir, cell, cells, THRESHOLD, settings)
    assert (before.verdict, before.n, before.stopped) == ("UNDECIDED", BLOCK * (decided - 1), False)
    for trial in cell.blocks()[decided - 1]:
        write_result(run_dir / trial.key, _result(trial, success=True))
    state = recorded_state(run_dir, cell, cells, THRESHOLD, settings)
    assert (state.verdict, state.decided_at) == ("PASS", BLOCK * decided)
    assert state.alpha == pytest.approx(ALPHA / runnable)

    results = recorded_results(run_dir, (t.key for c in cells for t in c.trials()))
    folded = fold_run(cells, results, THRESHOLD, "sequential", sequential=settings).gate
    decision = folded.decisions[f"{cell.row} {cell.column}"]
    assert (decision.verdict, decision.decided_at) == ("PASS", BLOCK * decided)


def test_a_session_of_two_cells_stops_each_at_its_share_of_the_level(pytester):
    """On the fake backend (fake_easy succeeds iff seed % 3 != 0: four of each block of six;
    fake_hard never): the easy cell passes at the first look whose e-value reaches 2/alpha,
    not 1/alpha, and the session runs none of its trials after that look."""
    threshold, block, looks = 0.35, 6, 10
    evidence = [_e_above(4 * look, block * look, threshold) for look in range(1, looks + 1)]
    decided = _first_look(evidence, 2 / ALPHA)
    assert decided is not None and decided < looks
    assert _first_look(evidence, 1 / ALPHA) != decided, evidence
    fake = FakeSession(pytester)
    fake.setenv(GAP_TEST_FAKE_MODULES=None)
    suites = [
        {"suite_name": name, "task_ids": [0, 1], "workflow_dir": "wf"}
        for name in ("fake_easy", "fake_hard")
    ]
    fake.config(
        {
            "backend": BACKEND,
            "trials": {"output_dir": "runs", "trials_per_generation": 3 * looks},
            "suites": suites,
            "gate_threshold": threshold,
            "gate_rule": "sequential",
            "sequential": {"block_seeds": 3},
        }
    )
    result = fake.run_inprocess("bench.yaml")
    out = result.stdout.str()
    assert result.ret == 1, out  # fake_hard fails
    assert f"fake_easy PASS at n={block * decided} of {block * looks} planned" in out
    records = fake.results(fake.run_dir())
    easy = [r for r in records.values() if r["suite"] == "fake_easy"]
    assert len(easy) == block * decided
    assert sorted({r["seed"] for r in easy}) == list(range(3 * decided))


# -- the baseline gate ----------------------------------------------------------------------------
def _baseline(cells, success, **gate) -> Baseline:
    records = {t.key: _result(t, success=success(t)) for c in cells for t in c.trials()}
    settings = BaselineGate(baseline="base_run", **gate)
    rows = {c.row: c.row for c in cells}
    return Baseline(
        path="base_run", run=RunDir(path="base_run", results=records), settings=settings, rows=rows
    )


@pytest.mark.parametrize("errored", [False, True], ids=["three_cells", "one_of_three_errored"])
def test_the_baseline_gate_fails_a_regression_at_its_share_of_the_level(tmp_path, errored):
    """The baseline succeeded everywhere; this run fails every trial of one cell of three (one
    of them errored, in the second case): FAIL at the first look whose "worse" e-value reaches
    2 cells/alpha (half the cell's share is the e-value's), as the session reads the run dir and
    as the fold reads the records."""
    data = _grid(gate={"baseline": "base_run", "block_seeds": 2})
    cells = _cells(data, errored)
    runnable = 2 if errored else 3
    against = _baseline(cells, lambda t: True, block_seeds=2)
    cell = cells[0]
    evidence = [_e_paired([-1] * BLOCK * look, MARGIN, "worse") for look in range(1, 11)]
    decided = _first_look(evidence, 2 * runnable / ALPHA)
    wrong = 2 / ALPHA if not errored else 2 * len(cells) / ALPHA
    assert decided is not None and decided < 10
    assert _first_look(evidence, wrong) != decided, evidence

    run_dir = tmp_path / "run"
    for block in cell.blocks()[: decided - 1]:
        for trial in block:
            write_result(run_dir / trial.key, _result(trial, success=False))
    before = baseline.recorded_state(run_dir, cell, cells, against)
    assert (before.verdict, before.n, before.stopped) == ("UNDECIDED", BLOCK * (decided - 1), False)
    for trial in cell.blocks()[decided - 1]:
        write_result(run_dir / trial.key, _result(trial, success=False))
    state = baseline.recorded_state(run_dir, cell, cells, against)
    assert (state.verdict, state.decided_at, state.stopped) == ("FAIL", BLOCK * decided, True)
    assert state.alpha == pytest.approx(ALPHA / runnable)

    results = recorded_results(run_dir, (t.key for t in cell.trials()))
    folded = baseline.cell_states(cells, results, against)[cell.key]
    assert (folded.verdict, folded.decided_at) == ("FAIL", BLOCK * decided)


def test_the_baseline_gates_last_look_tests_at_half_the_cells_share(tmp_path):
    """Seven of a cell's 40 pairs lost (only the baseline succeeded), in a config of three
    cells: too few for the e-value at any look, and at the plan's last look Tango's p lies
    between alpha/6 and alpha/2. Half of the cell's share (alpha/3) is Tango's: not shown
    worse, undecided with the plan spent (a rule that tested at alpha/2, or at the cell's whole
    share, would fail it)."""
    data = _grid(gate={"baseline": "base_run", "block_seeds": 2})
    cells = _cells(data, errored=False)
    against = _baseline(cells, lambda t: True, block_seeds=2)
    cell = cells[0]
    trials = cell.trials()
    lost = {t.key for t in trials[:7]}
    differences = [-1 if t.key in lost else 0 for t in trials]
    looks = [differences[: BLOCK * look] for look in range(1, 11)]
    share = ALPHA / len(cells)
    assert max(_e_paired(d, MARGIN, "worse") for d in looks) < 2 / share
    assert max(_e_paired(d, MARGIN, "within") for d in looks) < 1 / share
    p = tango_p_by_likelihood(7, 0, len(trials), MARGIN)
    assert share / 2 <= p < min(share, ALPHA / 2)

    run_dir = tmp_path / "run"
    for trial in trials:
        write_result(run_dir / trial.key, _result(trial, success=trial.key not in lost))
    state = baseline.recorded_state(run_dir, cell, cells, against)
    assert (state.verdict, state.spent, state.looks, state.n) == ("UNDECIDED", True, 10, 40)
    assert state.p_value == pytest.approx(p, rel=1e-6)
    results = recorded_results(run_dir, (t.key for t in trials))
    assert baseline.cell_states(cells, results, against)[cell.key].verdict == "UNDECIDED"


@pytest.mark.parametrize(
    "discordant",
    [
        # raw p 0.045, 0.025, 0.0017: all below alpha, Holm keeps only the third
        [(5, 0), (6, 0), (11, 0)],
        # raw p 0.0084, 0.022, 0.5: Holm keeps the first two, Bonferroni only the first
        [(8, 0), (9, 1), (2, 0)],
    ],
    ids=["holm_not_raw", "holm_not_bonferroni"],
)
def test_the_fixed_baseline_rule_adjusts_tangos_p_across_the_cells_by_holm(discordant):
    """Three cells of 40 pairs, each losing and winning the given pairs against the baseline:
    each cell's p is Tango's, adjusted by Holm (statsmodels) across the three, and a cell
    fails where the adjusted p is below alpha."""
    data = _grid(gate={"baseline": "base_run", "rule": "fixed"})
    cells = _cells(data, errored=False)
    outcomes = {}  # trial key -> (baseline succeeded, this run succeeded)
    for cell, (a_only, b_only) in zip(cells, discordant, strict=True):
        kinds = [(True, False)] * a_only + [(False, True)] * b_only
        for i, trial in enumerate(cell.trials()):
            outcomes[trial.key] = kinds[i] if i < len(kinds) else (True, True)
    against = _baseline(cells, lambda t: outcomes[t.key][0], rule="fixed")
    results = {t.key: _result(t, success=outcomes[t.key][1]) for c in cells for t in c.trials()}
    raw = [tango_p_by_likelihood(a, b, 40, MARGIN) for a, b in discordant]
    reject, adjusted, _, _ = multipletests(raw, alpha=ALPHA, method="holm")
    bonferroni = multipletests(raw, alpha=ALPHA, method="bonferroni")[0]
    # the case is one where Holm's verdicts differ from the raw p's, or from Bonferroni's
    assert list(reject) != [p < ALPHA for p in raw] or list(reject) != list(bonferroni)

    states = baseline.cell_states(cells, results, against)
    for cell, p, p_holm, fails in zip(cells, raw, adjusted, reject, strict=True):
        state = states[cell.key]
        assert state.p_value == pytest.approx(p, rel=1e-6)
        assert state.p_holm == pytest.approx(p_holm, rel=1e-6)
        assert state.verdict == ("FAIL" if fails else "PASS")
    labels = {c.key: f"{c.row} {c.column}" for c in cells}
    read = baseline.outcome(cells, results, against, labels)
    worse = [labels[c.key] for c, fails in zip(cells, reject, strict=True) if fails]
    assert [label for label, s in read.states.items() if s.verdict == "FAIL"] == worse


# -- the in-session A/B test ----------------------------------------------------------------------
def test_the_ab_test_decides_each_pair_at_its_share_of_the_level(tmp_path):
    """Three A/B pairs (one per variation): in one, B loses three pairs of every block of four
    and ties the fourth. B worse at the first look whose "worse" e-value reaches pairs/alpha,
    as the session reads the run dir before each trial and as the fold reads it."""
    data = _grid(policies=("base", "cand"), compare={"a": "base", "b": "cand", "block_seeds": 2})
    cells = _cells(data, errored=False)
    settings = ABCompare(a="base", b="cand", block_seeds=2)
    pairs = ab_gate.arms(cells, settings)
    assert len(pairs) == 3
    label, (cell_a, cell_b) = next(iter(pairs.items()))
    per_block = [-1, -1, -1, 0]
    evidence = [_e_paired(per_block * look, MARGIN, "worse") for look in range(1, 11)]
    decided = _first_look(evidence, len(pairs) / ALPHA)
    assert decided is not None and decided < 10
    assert _first_look(evidence, 1 / ALPHA) != decided, evidence

    run_dir = tmp_path / "run"

    def record(blocks_a, blocks_b):
        """A succeeds every trial; B's trial of the same episode as A's i-th of a block
        succeeds where the block's i-th difference is 0."""
        for block_a, block_b in zip(blocks_a, blocks_b, strict=True):
            of_b = {(t.task_id, t.seed): t for t in block_b}
            for i, a in enumerate(block_a):
                b = of_b[(a.task_id, a.seed)]
                write_result(run_dir / a.key, _result(a, success=True))
                write_result(run_dir / b.key, _result(b, success=per_block[i] == 0))

    record(cell_a.blocks()[: decided - 1], cell_b.blocks()[: decided - 1])
    before = ab_gate.recorded_pair_state(run_dir, cell_b, cells, settings)
    assert (before.verdict, before.n, before.stopped) == ("undecided", BLOCK * (decided - 1), False)
    record(cell_a.blocks()[decided - 1 : decided], cell_b.blocks()[decided - 1 : decided])
    state = ab_gate.recorded_pair_state(run_dir, cell_a, cells, settings)
    assert (state.verdict, state.n, state.stopped) == ("B worse", BLOCK * decided, True)
    assert state.alpha == pytest.approx(ALPHA / len(pairs))

    keys = [t.key for c in (cell_a, cell_b) for t in c.trials()]
    found, stopped = ab_gate.outcome(cells, recorded_results(run_dir, keys), settings)
    assert (found.states[label].verdict, found.states[label].n) == ("B worse", BLOCK * decided)
    assert stopped == {cell_a.key, cell_b.key}
