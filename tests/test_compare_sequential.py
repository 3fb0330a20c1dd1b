"""`gap compare --sequential` (issue 35 part 2; pytest_gap/compare/sequential_ab.py): each cell
read block by block as an anytime-valid test, on constructed records with known answers."""

from __future__ import annotations

import math

import pytest

from pytest_gap.compare.noninferiority import log_e_within, log_e_worse
from pytest_gap.compare.pairing import Pair
from pytest_gap.compare.sequential_ab import blocks, cell_state
from tests.test_compare import _gap_compare, _json, _pairs, _record, _run

TASKS = 4


def _outcomes(per_seed, seeds: int) -> list[tuple[int, int, bool, bool]]:
    """(task, seed, A succeeded, B succeeded) for every task and seed: `per_seed(task, seed)`."""
    return [(t, s, *per_seed(t, s)) for s in range(seeds) for t in range(TASKS)]


def _cell_pairs(outcomes) -> list[Pair]:
    pairs = []
    for task, seed, a_ok, b_ok in outcomes:
        a = _record("base", "object", task, seed, a_ok)
        b = _record("cand", "object", task, seed, b_ok)
        pairs.append(Pair(key=("libero", "libero", "object", task, seed), a=a, b=b))
    return pairs


def test_blocks_hold_every_task_and_stop_at_the_first_incomplete_one():
    pairs = _cell_pairs(_outcomes(lambda t, s: (True, True), seeds=7))
    pairs = [p for p in pairs if not (p.key[3] == 2 and p.key[4] == 6)]  # task 2 lacks seed 6
    found = blocks(pairs, 3)
    assert [len(b) for b in found] == [12, 12]  # seeds 0-2, 3-5; seed 6 not complete
    assert {(p.key[3], p.key[4]) for p in found[0]} == {(t, s) for t in range(4) for s in range(3)}


def test_a_regression_is_decided_at_the_first_look_whose_evidence_crosses():
    """A succeeds everywhere, B nowhere: B worse once log e reaches log(1/alpha), at a block
    boundary; the pairs after that look are not read."""
    pairs = _cell_pairs(_outcomes(lambda t, s: (True, False), seeds=20))
    state = cell_state("libero/object", pairs, 0.05, 0.05, 2)
    needed = next(k for k in range(1, 80) if log_e_worse(k, 0, k, 0.05) >= math.log(20))
    assert state.verdict == "B worse" and state.n == -(-needed // 8) * 8  # whole blocks of 8
    assert state.n_pairs == 80 and state.a_only == state.n


def test_b_better_and_b_within_the_margin_are_decided_too():
    better = _cell_pairs(_outcomes(lambda t, s: (False, True), seeds=20))
    assert cell_state("c", better, 0.05, 0.05, 2).verdict == "B better"
    same = _cell_pairs(_outcomes(lambda t, s: (True, True), seeds=30))
    state = cell_state("c", same, 0.05, 0.05, 2)
    assert state.verdict == "B not worse"
    assert log_e_within(0, 0, state.n, 0.05) >= math.log(20) > log_e_within(0, 0, state.n - 8, 0.05)
    few = _cell_pairs(_outcomes(lambda t, s: (True, True), seeds=4))
    assert cell_state("c", few, 0.05, 0.05, 2).verdict == "undecided"


def test_gap_compare_sequential_exits_1_on_a_regression_and_splits_alpha_over_cells(
    tmp_path, capsys
):
    records = _pairs(_outcomes(lambda t, s: (True, s % 4 == 0), seeds=20))
    records += _pairs(_outcomes(lambda t, s: (True, True), seeds=20), variation="spatial")
    run = _run(tmp_path / "run", records)
    code, data = _json(
        capsys, run, "--a", "policy_only@base", "--b", "policy_only@cand", "--sequential"
    )
    assert code == 1
    states = {s["cell"]: s for s in data["sequential"]}
    assert states["libero/object"]["verdict"] == "B worse"
    assert states["libero/object"]["alpha"] == 0.025  # two cells
    assert states["libero/spatial"]["verdict"] in ("B not worse", "undecided")
    code, out, _ = _gap_compare(
        capsys, run, "--a", "policy_only@base", "--b", "policy_only@cand", "--sequential",
        "--block-seeds", "4", "--margin", "0.1",
    )  # fmt: skip
    assert code == 1
    assert "sequential (anytime-valid, margin 0.1, alpha split over the cells):" in out
    assert out.splitlines()[-1].startswith(
        "B is worse than A by more than the margin (anytime-valid, alpha 0.05, margin 0.1): "
        "libero/object: B worse at n="
    )
    # the same records without --sequential: McNemar's rows decide, as before
    plain, _, _ = _gap_compare(capsys, run, "--a", "policy_only@base", "--b", "policy_only@cand")
    assert plain == 1
    with pytest.raises(SystemExit) as refused:  # argparse: usage and the one-line error
        _gap_compare(capsys, run, "--sequential", "--block-seeds", "0")
    assert refused.value.code == 2
    assert "'0' is not a whole number of 1 or more" in capsys.readouterr().err
