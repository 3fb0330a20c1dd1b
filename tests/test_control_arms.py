"""Matched control arms (issue 35 part 3): which families declare one (LIBERO's catalogue), how
a plan adds and marks them, the paired drop against answers computed here, whole sessions on
the fake backend (summary, pivot, `gap compare --controls`, the report model) and one real
LIBERO session where a policy that memorized libero_object's basket loses posvar/pos_var."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import binomtest

from pytest_gap.cells import Cell
from pytest_gap.config import ConfigError, parse_config
from pytest_gap.control_drop import control_drop, control_drops
from pytest_gap.plan import plan
from pytest_gap.results import TrialResult
from pytest_gap.sim import backend as sim
from tests.fake_session import FakeSession
from tests.test_report import _result

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
GAP = str(Path(sys.executable).with_name("gap"))
POLICY = {"command": "gap policy serve hold --port {port}"}
TEMPLATE = {"policy_only": {"template": "policy_only"}}


def _grid(**benchmark) -> dict:
    block = {"modes": ["policy_only"], "policies": ["p"], "mode_overrides": TEMPLATE}
    return {"policies": {"p": POLICY, "q": POLICY}, "benchmark": {**block, **benchmark}}


def _cells(data: dict) -> list[Cell]:
    return plan(parse_config(data, "grid.yaml"))


# -- what declares a control ----------------------------------------------------------------------
def test_libero_families_declare_the_arm_with_the_same_tasks_and_seeds(capsys):
    from pytest_gap.cli import main

    assert main(["families"]) == 0
    listed = {line.split()[0]: line.split()[4:] for line in capsys.readouterr().out.splitlines()}
    assert listed["posvar/basket_swap"] == ["libero/object"]
    assert listed["libero_pro/goal_lan"] == ["libero/goal"]
    assert listed["libero_pro/goal_with_milk"] == [] and listed["libero/goal"] == []
    libero = sim.get_backend("libero")
    for variation in ("pos_var", "permutation", "basket_swap", "all"):
        assert sim.declared_control(libero, "posvar", variation) == ("libero", "object")
    # LIBERO-PRO variants that keep their base suite's tasks, by id: the base suite
    assert sim.declared_control(libero, "libero_pro", "goal_swap") == ("libero", "goal")
    assert sim.declared_control(libero, "libero_pro", "spatial_lan") == ("libero", "spatial")
    assert sim.declared_control(libero, "libero_pro", "object_temp_x0.3") == ("libero", "object")
    # added distractors rename and reorder the tasks: no matched arm; nor for unperturbed suites
    # or a family that changes the task itself
    assert sim.declared_control(libero, "libero_pro", "goal_with_milk") is None
    assert sim.declared_control(libero, "libero", "object") is None
    assert sim.declared_control(libero, "grocery_packing", "object") is None


class _Declaring:
    """A family whose declaration is whatever the test gives it."""

    name = "fake"

    def __init__(self, control):
        self._control = control

    def variations(self):
        return ["easy", "hard"]

    def resolve(self, variation):
        return sim.Variation(family="fake", variation=variation, suite=f"fake_{variation}")

    def control(self, variation):
        return self._control


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ("fake/easy", "control('hard') returned 'fake/easy'; it must return a (family, variation)"),
        (("fake", "hard"), "fake/hard names itself as its control; return None"),
        (("fake", "medium"), "the control of hard is fake/medium, which this backend cannot run"),
    ],
)
def test_a_broken_declaration_is_a_one_line_error_naming_the_family(declared, message):
    from tests.fake_backend import FakeBackend

    class Backend(FakeBackend):
        def families(self):
            return {"fake": _Declaring(declared)}

    with pytest.raises(sim.SimInputError) as exc:
        sim.declared_control(Backend(), "fake", "hard")
    assert message in str(exc.value) and "\n" not in str(exc.value)


# -- planning -------------------------------------------------------------------------------------
def test_controls_true_adds_each_rows_control_arm_once_before_its_first_perturbed_cell():
    cells = _cells(
        _grid(
            families=["posvar"],
            variations=["pos_var", "all"],
            policies=["p", "q"],
            task_ids=[0, 3],
            seeds=[4, 7],
            controls=True,
        )
    )
    assert [(c.policy_id, c.column, c.control) for c in cells] == [
        ("p", "libero/object", None),
        ("p", "posvar/pos_var", "policy_only/p/libero/object"),
        ("p", "posvar/all", "policy_only/p/libero/object"),
        ("q", "libero/object", None),
        ("q", "posvar/pos_var", "policy_only/q/libero/object"),
        ("q", "posvar/all", "policy_only/q/libero/object"),
    ]
    control = cells[0]
    assert control.suite == "libero_object" and control.key == "policy_only/p/libero/object"
    assert (control.task_ids, control.seeds) == ((0, 3), (4, 7))  # the perturbed cells' own


def test_a_grid_that_lists_the_control_is_marked_without_controls_and_nothing_is_added():
    cells = _cells(_grid(families=["libero", "posvar"], variations=["object", "pos_var"]))
    assert [(c.column, c.control) for c in cells] == [
        ("libero/object", None),
        ("posvar/pos_var", "policy_only/p/libero/object"),
    ]
    # without the control in the grid, and without controls: true, nothing is marked or added
    alone = _cells(_grid(families=["posvar"], variations=["pos_var"]))
    assert [(c.column, c.control) for c in alone] == [("posvar/pos_var", None)]


def test_controls_on_a_grid_without_a_perturbation_is_refused_in_one_line():
    with pytest.raises(ConfigError) as exc:
        _cells(_grid(families=["libero"], variations=["goal"], controls=True))
    (problem,) = exc.value.problems
    assert problem.startswith("benchmark.controls: true, but no variation of the grid declares")


def test_a_suites_config_pairs_the_entries_it_lists():
    data = {
        "suites": [
            {"suite_name": "libero_object"},
            {"suite_name": "posvar/basket_swap"},
            {"suite_name": "libero_pro/goal_swap"},
        ],
    }
    cells = _cells(data)
    assert [(c.key, c.control) for c in cells] == [
        ("suites/libero_object", None),
        ("suites/posvar__basket_swap", "suites/libero_object"),
        ("suites/libero_pro__goal_swap", None),  # its control (libero/goal) is not listed
    ]


# -- the drop -------------------------------------------------------------------------------------
def test_the_drop_is_control_minus_perturbed_over_the_pairs_with_mcnemar_and_a_task_interval():
    cells = _cells(
        _grid(families=["posvar"], variations=["pos_var"], task_ids=[0, 1], seeds=[0, 1, 2, 3])
    )
    control = cells[0].model_copy(update={"family": "libero", "variation": "object"})
    perturbed = cells[0].model_copy(update={"control": control.key})
    # task 0: control 4/4, perturbed 1/4; task 1: control 2/4, perturbed 2/4, one discordant
    # pair each way; seed 3 of task 1 errored on the perturbed arm: left out of both.
    outcomes = {
        (0, 0): (True, False),
        (0, 1): (True, False),
        (0, 2): (True, False),
        (0, 3): (True, True),
        (1, 0): (True, False),
        (1, 1): (False, True),
        (1, 2): (True, True),
        (1, 3): (False, False),
    }
    results = {}
    for (task, seed), (c_ok, p_ok) in outcomes.items():
        for cell, ok in ((control, c_ok), (perturbed, p_ok)):
            errored = cell is perturbed and (task, seed) == (1, 3)
            trial = next(t for t in cell.trials() if (t.task_id, t.seed) == (task, seed))
            results[trial.key] = _result(
                trial, ok and not errored, error="boom" if errored else None
            )
    drop = control_drop(perturbed, control, results)
    assert (drop.n_pairs, drop.n_excluded, drop.n_tasks) == (7, 1, 2)
    assert drop.control_rate == pytest.approx(6 / 7) and drop.perturbed_rate == pytest.approx(3 / 7)
    assert drop.drop == pytest.approx(3 / 7)
    # discordant: control only 4 (0/0, 0/1, 0/2, 1/0), perturbed only 1 (1/1)
    assert drop.p_value == pytest.approx(binomtest(4, 5, 0.5).pvalue)
    # resampling whole tasks: the drop of task 0 is 3/4, of task 1 0/3; the interval spans them
    assert drop.drop_ci_low == pytest.approx(0.0) and drop.drop_ci_high == pytest.approx(0.75)
    assert drop.text() == f"0.43 [0.00,0.75] p={drop.p_value:.3g} n=7"
    # keyed by the perturbed cell, and only where its control is planned
    assert set(control_drops([control, perturbed], results)) == {perturbed.key}
    assert control_drops([perturbed], results) == {}


# -- sessions on the fake backend ----------------------------------------------------------------
def test_a_session_reports_the_drop_and_gap_compare_pairs_the_declared_arms(pytester):
    """fake/hard declares fake/easy (tests/fake_backend.py ControlledFakeBackend): easy succeeds
    on seeds 1 and 2 of every 3, hard never; their init states differ (by suite)."""
    session = FakeSession(pytester)
    session.config(
        {
            "benchmark": {
                "backend": "fake_backend:ControlledFakeBackend",
                "families": ["fake"],
                "variations": ["hard"],
                "modes": ["workflow"],
                "task_ids": [0, 1],
                "seeds": [1, 2, 3],
                "controls": True,
                "gate_threshold": 0.3,
                "output_dir": "runs",
                "mode_overrides": {"workflow": {"workflow_dir": "wf"}},
            }
        }
    )
    result = session.run("bench.yaml", "-p", "no:cacheprovider")
    out = result.stdout.str()
    result.assert_outcomes(passed=4, failed=8)
    # the control arm ran first, in its row, and the drop is the paired one: 4 of 6 pairs lost
    assert "drop      fake/hard\n" in out, out
    assert "workflow  0.67 [0.67,0.67] p=0.125 n=6\n" in out  # each task lost 2 of 3
    assert "(fake/hard vs fake/easy)" in out
    run = session.run_dir()
    summary = json.loads((run / "summary.json").read_text())
    (hard,) = [c for c in summary["cells"] if c["variation"] == "hard"]
    assert hard["control"]["control"] == "fake/easy"
    assert (hard["control"]["control_rate"], hard["control"]["perturbed_rate"]) == (4 / 6, 0.0)
    assert hard["control"]["n_pairs"] == 6 and summary["matrix"]["drop"] == {
        "workflow": {"fake/hard": round(4 / 6, 4)}
    }
    tsv = (run / "summary.tsv").read_text().split("\n\n")
    header, easy, hard_row = tsv[0].splitlines()
    # the control columns, then how the failures failed (this backend records no steps)
    assert header.endswith(
        "\tcontrol\tcontrol_rate\tperturbed_rate\tdrop\tdrop_ci_low\t"
        "drop_ci_high\tdrop_p\tdrop_n_pairs\tfail_no_evidence"
    )
    assert easy.endswith("\t" * 9 + "2")  # the control arm has no control of its own
    assert hard_row.endswith("\tfake/easy\t0.667\t0.000\t0.667\t0.667\t0.667\t0.125\t6\t6")
    assert tsv[-1].startswith("drop_pivot\tfake/hard\nworkflow\t0.667")

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}

    def compare(*args):
        return subprocess.run(
            [GAP, "compare", str(run), *args], capture_output=True, text=True, env=env
        )

    # without --controls the row cannot be compared with itself
    same = compare("--a", "workflow", "--b", "workflow")
    assert same.returncode == 2 and "name the same row" in same.stderr
    paired = compare("--controls", "--json")
    assert paired.returncode == 0, paired.stderr  # 4 discordant pairs: p 0.125, not significant
    found = json.loads(paired.stdout)
    assert found["controls"] is True and found["unpaired"] == {"a": 0, "b": 0}
    (cell,) = found["cells"]
    assert (cell["cell"], cell["n_pairs"], cell["a_only"], cell["b_only"]) == ("fake/hard", 6, 4, 0)
    assert cell["diff"] == pytest.approx(-4 / 6) and cell["p_value"] == pytest.approx(0.125)
    # the report viewer's model carries the drop to the page
    from pytest_gap.viz.model import load_report

    shown = {c.column: c.control for c in load_report(run, run, inline_budget=0).cells}
    assert shown["fake/easy"] is None and shown["fake/hard"].drop == pytest.approx(4 / 6)


def test_gap_compare_controls_refuses_what_is_not_a_declared_pair(tmp_path, capsys):
    from tests.test_compare import _gap_compare, _run
    from tests.test_compare import _record as compare_record

    def refused(run: Path) -> str:
        code, out, err = _gap_compare(capsys, run, "--controls")
        assert code == 2, out + err
        return err

    # libero/object and libero/goal: neither declares a control
    plain = _run(
        tmp_path / "plain",
        [compare_record("base", v, 0, s, True) for v in ("object", "goal") for s in range(2)],
    )
    assert "no cell of B (libero/goal, libero/object) declares a control arm" in refused(plain)

    def posvar(seed: int, init_state: int | None, success: bool) -> TrialResult:
        r = compare_record("base", "pos_var", 0, seed, success)
        return r.model_copy(
            update={"family": "posvar", "suite": "libero_object", "init_state": init_state}
        )

    # posvar without its control arm in A
    lonely = refused(_run(tmp_path / "lonely", [posvar(s, s, False) for s in range(2)]))
    assert "A (policy_only@base in" in lonely and "declare (libero/object)" in lonely

    # with the control, but started from another init state than its perturbation
    control = [
        compare_record("base", "object", 0, s, True).model_copy(update={"init_state": s})
        for s in range(2)
    ]
    shifted = _run(tmp_path / "shifted", [*control, posvar(0, 0, False), posvar(1, 7, False)])
    assert "init state index differs for 1 pair (posvar/pos_var task 0 seed 1: 1 vs 7)" in (
        refused(shifted)
    )

    # the same records with matching init states compare: different init-state and scene
    # digests are what a perturbation is, and one policy serves both arms
    matched = _run(tmp_path / "matched", [*control, posvar(0, 0, False), posvar(1, 1, True)])
    code, out, err = _gap_compare(capsys, matched, "--controls")
    assert code == 0, err
    assert "A: each B cell's declared control arm, paired by task and seed" in out
    assert "posvar/pos_var  2        2/2  1/2  -0.500" in out
    # the control arm in one run, the perturbed cells in another
    arm = _run(tmp_path / "arm", control)
    moved = _run(tmp_path / "moved", [posvar(0, 0, False), posvar(1, 1, True)])
    code, out, err = _gap_compare(capsys, arm, moved, "--controls", "--json")
    assert code == 0, err
    assert json.loads(out)["pooled"]["diff"] == -0.5


# -- real LIBERO ----------------------------------------------------------------------------------
@pytest.mark.libero
def test_posvar_costs_a_policy_that_memorized_the_basket_what_its_control_arm_shows(pytester):
    """The scripted oracle carrying to where libero_object's basket usually stands
    (tests/memorized_basket.py): unperturbed it succeeds; posvar/pos_var moves the basket
    (task 0 seeds 0 and 1: 12 and 13 cm away) and it drops the object where the basket was."""
    pytester.makefile(
        ".yaml",
        ctl=json.dumps(
            {
                "policies": {
                    "memorized": {
                        "command": "gap policy serve tests.memorized_basket:MemorizedBasket "
                        "--port {port}",
                        "privileged_state": True,
                    }
                },
                "trials": {"max_steps": 175},
                "benchmark": {
                    "families": ["posvar"],
                    "variations": ["pos_var"],
                    "modes": ["policy_only"],
                    "policies": ["memorized"],
                    "task_ids": [0],
                    "seeds": [0, 1],
                    "num_workers": 1,
                    "controls": True,
                    "output_dir": "runs",
                    "mode_overrides": TEMPLATE,
                },
            }
        ),
    )
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    pytester._monkeypatch.setenv("PYTHONPATH", path)
    result = pytester.runpytest_subprocess("ctl.yaml", "-p", "no:cacheprovider", timeout=600)
    out = result.stdout.str()
    result.assert_outcomes(passed=2, failed=2)
    assert "policy_only@memorized[privileged]  1.00 [1.00,1.00] p=0.5 n=2" in out, out
    (run,) = (pytester.path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    (moved,) = [c for c in summary["cells"] if c["family"] == "posvar"]
    assert moved["control"]["control"] == "libero/object" and moved["control"]["drop"] == 1.0
    compared = subprocess.run(
        [GAP, "compare", str(run), "--controls", "--json"], capture_output=True, text=True
    )
    assert compared.returncode == 0, compared.stderr  # two pairs cannot reach significance
    (cell,) = json.loads(compared.stdout)["cells"]
    assert (cell["cell"], cell["a_success"], cell["b_success"]) == ("posvar/pos_var", 2, 0)
