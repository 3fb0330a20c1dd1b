"""The in-session sequential A/B test (issue 35 part 2; pytest_gap/ab_gate.py): `compare: {a, b}`
pairs two policies' cells, runs their blocks together and stops both arms once decided."""

from __future__ import annotations

import json
import math

import pytest

from pytest_gap.ab_gate import arms, outcome
from pytest_gap.compare.noninferiority import log_e_within, log_e_worse
from pytest_gap.config import ConfigError, parse_config
from pytest_gap.config.model import ABCompare
from pytest_gap.plan import plan
from pytest_gap.report import fold_run
from tests.fake_session import BACKEND, FakeSession
from tests.test_report import ROOT, _result

pytest_plugins = ["pytester"]


def _grid(compare: dict | None = None, policies=("base", "cand", "other")) -> dict:
    return {
        "benchmark": {
            "families": ["libero"],
            "variations": ["object", "spatial"],
            "modes": ["policy_only"],
            "policies": list(policies),
            "task_ids": [0, 1],
            "n_seeds": 20,
            "mode_overrides": {"policy_only": {"template": "policy_only"}},
        },
        "policies": {p: {"url": f"ws://h:{i + 1}"} for i, p in enumerate(policies)},
        "compare": {"a": "base", "b": "cand", "block_seeds": 2, **(compare or {})},
    }


def test_the_two_arms_pair_by_cell_and_take_turns_together():
    cells = plan(parse_config(_grid(), "grid.yaml", base=ROOT))
    settings = ABCompare(a="base", b="cand", block_seeds=2)
    pairs = arms(cells, settings)
    assert sorted(pairs) == ["policy_only libero/object", "policy_only libero/spatial"]
    for cell_a, cell_b in pairs.values():
        assert (cell_a.policy_id, cell_b.policy_id) == ("base", "cand")
        assert cell_a.turn_key == cell_b.turn_key != cell_a.key
        assert cell_a.block_seeds == cell_b.block_seeds == 2
    other = [c for c in cells if c.policy_id == "other"]
    assert other and all(c.ab_pair is None and c.turn_key == c.key for c in other)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"compare": {"a": "base", "b": "nobody"}}, r"compare\.b: 'nobody' is not in benchmark"),
        ({"compare": {"a": "base", "b": "base"}}, r"compare\.b: the same policy as compare\.a"),
        ({"gate": {"baseline": "somewhere"}}, r"gate\.baseline and compare each decide"),
    ],
)
def test_an_ab_pair_that_cannot_be_run_is_refused_in_one_line(change, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({**_grid(), **change}, "grid.yaml", base=ROOT)


def test_a_worse_b_is_decided_at_a_block_both_arms_completed_and_both_stop():
    cells = plan(parse_config(_grid(policies=("base", "cand")), "grid.yaml", base=ROOT))
    settings = ABCompare(a="base", b="cand", block_seeds=2)
    cell_a, cell_b = arms(cells, settings)["policy_only libero/object"]
    results = {}
    looks = 0
    for block_a, block_b in zip(cell_a.blocks(), cell_b.blocks(), strict=True):
        results |= {t.key: _result(t, success=True) for t in block_a}
        # B's block half recorded: that look cannot happen yet
        half = {t.key: _result(t, success=False) for t in block_b[:2]}
        found, stopped = outcome(cells, results | half, settings)
        assert not stopped
        results |= {t.key: _result(t, success=False) for t in block_b}
        looks += 1
        found, stopped = outcome(cells, results, settings)
        if stopped:
            break
    state = found.states["policy_only libero/object"]
    share = 0.05 / 2
    assert state.verdict == "B worse" and state.n == 4 * looks
    assert log_e_worse(state.n, 0, state.n, 0.05) >= math.log(1 / share)
    assert log_e_worse(state.n - 4, 0, state.n - 4, 0.05) < math.log(1 / share)
    assert stopped == {cell_a.key, cell_b.key}
    selected = {t.id for c in cells for t in c.trials()}
    # the spatial pair: both arms agree everywhere, all 40 pairs recorded
    for cell in [c for c in cells if c.variation == "spatial"]:
        results |= {t.key: _result(t, success=t.seed % 2 == 0) for t in cell.trials()}
    summary = fold_run(cells, results, 0.9, "point", selected=selected, ab=settings)
    gate = summary.gate
    assert gate.verdict == "FAIL" and gate.rule == "compare"
    assert gate.coverage.not_needed == 2 * (40 - state.n) and not gate.coverage.missing
    line = gate.line()
    assert line.startswith("gate FAIL: success_rate=") and "rule=compare:cand-vs-base" in line
    assert "(cand is worse than base by more than the margin: policy_only libero/object: B " in line
    spatial = gate.ab.states["policy_only libero/spatial"]
    assert spatial.verdict in ("undecided", "B not worse") and spatial.stopped


def test_a_session_runs_both_arms_block_by_block_and_stops_both_once_b_is_not_worse(pytester):
    """On the fake backend both arms have the same outcomes (success iff seed % 3 != 0): every
    pair agrees, which is evidence that B is not worse by the margin; the pair is decided
    after enough blocks and neither arm runs the rest. The two policies are managed `hold`
    servers (the cells' workflow does not call them)."""
    fake = FakeSession(pytester)
    fake.setenv(GAP_TEST_FAKE_MODULES=None)
    hold = ["gap", "policy", "serve", "hold", "--port", "{port}"]
    fake.config(
        {
            "policies": {"base": {"command": hold}, "cand": {"command": hold}},
            "benchmark": {
                "backend": BACKEND,
                "families": ["fake"],
                "variations": ["easy"],
                "modes": ["policy_only"],
                "policies": ["base", "cand"],
                "task_ids": [0, 1, 2, 3],
                "n_seeds": 40,
                "num_workers": 1,
                "output_dir": "runs",
                "mode_overrides": {"policy_only": {"workflow_dir": "wf"}},
            },
            "compare": {"a": "base", "b": "cand", "block_seeds": 5},
        }
    )
    collected = fake.run_inprocess("bench.yaml", "--co", "-q").stdout.lines
    order = [line.split("::")[1] for line in collected if line.startswith("bench.yaml::")]
    assert order[:40] == ["policy_only@base"] * 20 + ["policy_only@cand"] * 20  # block 1 each
    assert order[40:60] == ["policy_only@base"] * 20
    result = fake.run_inprocess("bench.yaml", "-rs")
    out = result.stdout.str()
    assert result.ret == 0, out
    needed = next(n for n in range(20, 200, 20) if log_e_within(0, 0, n, 0.05) >= math.log(20))
    outcomes = result.parseoutcomes()
    ran = outcomes.get("passed", 0) + outcomes.get("failed", 0)
    assert ran == 2 * needed < 320 and outcomes["skipped"] == 320 - ran, outcomes
    assert f"policy_only fake/easy: B not worse at n={needed} of 160 planned pairs" in out
    assert f"{320 - ran} not needed (decided by the sequential gate)" in out
    summary = json.loads((fake.run_dir() / "summary.json").read_text())
    assert summary["gate"]["ab"]["states"]["policy_only fake/easy"]["verdict"] == "B not worse"

    # under xdist the arms take turns by block too: the same decision, the rest not run (a
    # trial a worker had started before the decision still runs)
    spread = fake.run("bench.yaml", "-n", "2", "--gap-output-dir", "spread")
    out = spread.stdout.str()
    assert spread.ret == 0, out
    assert f"policy_only fake/easy: B not worse at n={needed} of 160 planned pairs" in out
    outcomes = spread.parseoutcomes()
    assert 2 * needed <= outcomes.get("passed", 0) + outcomes.get("failed", 0) < 320, outcomes
