"""The mode table and the producers: a mode is a row a plugin returns from `pytest_gap_modes`,
templates ship in the package, and a workflow is produced once per destination, atomically,
whatever producer writes it."""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import pytest_gap
from pytest_gap import modes
from pytest_gap.config import ConfigError, parse_config
from pytest_gap.errors import GapError
from pytest_gap.layout import PRODUCED_FILE
from pytest_gap.modes import BUILTIN, BUILTIN_MODES, BUILTIN_PRODUCERS, Mode, ModeTable
from pytest_gap.plan import plan
from pytest_gap.producers.base import ProduceRequest, produce
from pytest_gap.producers.templates import template_dir, template_names

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
PICK_PLACE = TESTS.parent / "examples/workflows/pick_place"
POLICIES = {"pi05": {"url": "ws://h:1"}, "molmo": {"url": "ws://h:2"}}


def _table(*rows: Mode, **producers) -> ModeTable:
    """The built-in table plus `rows` and `producers`, as a session builds it from its hooks."""
    return ModeTable.of([BUILTIN_MODES, rows], [BUILTIN_PRODUCERS, producers])


def _grid(**block) -> dict:
    block = {"families": ["libero"], "variations": ["object"], "n_tasks": 1, "n_seeds": 1, **block}
    return {"benchmark": block, "policies": POLICIES}


def test_the_built_in_rows():
    assert BUILTIN.names() == ("llm_generation", "llm_plus_policy", "policy_only", "workflow")
    assert BUILTIN.defaults() == ("llm_generation", "llm_plus_policy", "policy_only")
    axis = {name: BUILTIN.get(name).takes_policy_axis for name in BUILTIN.names()}
    assert axis == {
        "llm_generation": False,
        "llm_plus_policy": True,
        "policy_only": True,
        "workflow": False,
    }
    assert [n for n in BUILTIN.names() if BUILTIN.needs_llm(n)] == ["llm_generation"]
    assert not BUILTIN.needs_workflow("llm_generation") and BUILTIN.needs_workflow("workflow")
    # The table is not global state: there is nothing to register into.
    assert not hasattr(modes, "register_mode") and not hasattr(modes, "_MODES")


def test_a_suites_entry_asks_the_table_which_mode_runs_it():
    """A suites config has no modes: key: an entry with a workflow_dir runs the table's
    `suites="given"` row, one without its `suites="generated"` row; a plugin's row takes the
    built-in's place, and its producer decides whether the cell needs the LLM."""
    assert BUILTIN.suites_mode(given=True) == "workflow"
    assert BUILTIN.suites_mode(given=False) == "llm_generation"
    data = {
        "suites": [
            {"suite_name": "libero_object", "task_ids": [0], "workflow_dir": str(PICK_PLACE)},
            {"suite_name": "libero_object", "task_ids": [1]},
        ]
    }
    assert [c.mode for c in plan(parse_config(data, "s.yaml"))] == ["workflow", "llm_generation"]
    sketch = Mode(name="sketch", producer="prebuilt", suites="generated")
    table = _table(sketch)
    assert table.suites_mode(given=False) == "sketch"
    cells = plan(parse_config(data, "s.yaml", mode_table=table), mode_table=table)
    assert [c.mode for c in cells] == ["workflow", "sketch"]
    assert cells[1].error is None and not cells[1].uses_llm  # a prebuilt producer: no LLM
    bare = ModeTable([m for m in BUILTIN_MODES if m.suites != "given"], BUILTIN_PRODUCERS)
    with pytest.raises(GapError, match="no mode runs a suites entry with a workflow_dir"):
        bare.suites_mode(given=True)


def test_a_plugin_row_drives_validation_the_policy_axis_and_cell_errors():
    config = _grid(modes=["ab_probe"], mode_overrides={"ab_probe": {"template": "policy_only"}})
    with pytest.raises(ConfigError, match=r"benchmark\.modes: unknown mode 'ab_probe'"):
        parse_config(config, "grid.yaml", base=ROOT)

    row = Mode(name="ab_probe", producer="prebuilt", takes_policy_axis=True)
    table = ModeTable.of([BUILTIN_MODES, [row], [row]], [BUILTIN_PRODUCERS])  # the same row: one
    assert table.names()[-1] == "ab_probe" and BUILTIN.names()[-1] == "workflow"
    with pytest.raises(GapError, match="mode 'ab_probe' is defined twice with different rows"):
        _table(row, Mode(name="ab_probe", producer="llm"))
    with pytest.raises(GapError, match="names producer 'nope', which no plugin provides"):
        _table(Mode(name="ab_probe", producer="nope"))

    config["benchmark"]["policies"] = ["pi05", "molmo"]
    cells = plan(parse_config(config, "grid.yaml", base=ROOT, mode_table=table), mode_table=table)
    assert [(c.row, c.error) for c in cells] == [("ab_probe@pi05", None), ("ab_probe@molmo", None)]
    assert cells[0].workflow_dir == template_dir("policy_only")
    assert not cells[0].needs_llm

    del config["benchmark"]["mode_overrides"]
    (cell, _) = plan(
        parse_config(config, "grid.yaml", base=ROOT, mode_table=table), mode_table=table
    )
    assert cell.error == (
        "benchmark.mode_overrides.ab_probe.workflow_dir is not set: the ab_probe mode runs that "
        "workflow directory; set it (e.g. examples/workflows/pick_place)"
    )


def test_a_row_whose_producer_is_the_llm_needs_the_llm(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    table = _table(Mode(name="draft", producer="llm"))
    (cell,) = plan(
        parse_config(_grid(modes=["draft"]), "grid.yaml", base=ROOT, mode_table=table),
        mode_table=table,
    )
    assert cell.uses_llm and "llm.model is not set" in cell.error


def test_a_plugin_row_marked_default_runs_when_modes_is_left_out():
    table = _table(Mode(name="probe", producer="prebuilt", takes_policy_axis=True, default=True))
    config = _grid(policies=["pi05"])
    assert parse_config(config, "grid.yaml", base=ROOT).benchmark.modes == list(BUILTIN.defaults())
    chosen = parse_config(config, "grid.yaml", base=ROOT, mode_table=table).benchmark.modes
    assert chosen == [*BUILTIN.defaults(), "probe"]


def test_templates_are_named_in_configs_with_one_line_errors():
    ok = parse_config(
        _grid(
            modes=["policy_only"],
            policies=["pi05"],
            mode_overrides={"policy_only": {"template": "policy_only"}},
        ),
        "grid.yaml",
        base=ROOT,
    )
    assert ok.benchmark.mode_overrides["policy_only"].template == "policy_only"
    bad = _grid(
        modes=["policy_only", "llm_generation", "workflow"],
        mode_overrides={
            "policy_only": {"template": "policy_onyl"},
            "llm_generation": {"workflow_dir": "examples/workflows/pick_place"},
            "workflow": {
                "template": "policy_only",
                "workflow_dir": "examples/workflows/pick_place",
            },
        },
    )
    with pytest.raises(ConfigError) as info:
        parse_config(bad, "grid.yaml", base=ROOT)
    assert info.value.problems == [
        "benchmark.mode_overrides.policy_only.template: unknown template 'policy_onyl'; did you "
        "mean 'policy_only'?",
        "benchmark.mode_overrides.llm_generation.workflow_dir: the llm_generation mode produces "
        "its own workflow; remove workflow_dir (mode workflow runs a directory as written)",
        "benchmark.mode_overrides.workflow: set template or workflow_dir, not both",
    ]


def test_templates_ship_inside_the_package():
    assert template_names() == ["llm_plus_policy", "policy_only", "policy_only_bare"]
    package = Path(pytest_gap.__file__).parent
    for name in template_names():
        assert template_dir(name) == package / "templates" / name
    assert not (ROOT / "examples/templates").exists()  # one home for them
    # The wheel carries them: setuptools' package-data globs match every template file.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["pytest_gap"]
    files = [p.relative_to(package).as_posix() for p in (package / "templates").rglob("*.json")]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files)
    with pytest.raises(GapError, match="unknown template 'nope'; use one of llm_plus_policy"):
        template_dir("nope")


class _Counting:
    """A test-only producer kind: writes a give-up workflow, counts calls, fails on request."""

    needs_source = False
    needs_llm = False

    def __init__(self, fail: bool = False):
        self.calls, self.fail = 0, fail

    def write(self, request: ProduceRequest, directory: Path) -> dict:
        self.calls += 1
        (directory / "notes.txt").write_text("half written")
        if self.fail:
            raise GapError("the producer could not write it")
        workflow = {
            "version": 1,
            "name": "give_up",
            "description": request.instruction,
            "start": "failed",
            "nodes": {"failed": {"type": "end", "status": "failure"}},
        }
        (directory / "workflow.json").write_text(json.dumps(workflow))
        return {"source": "counting", "prompt": request.instruction}


def test_produce_writes_once_and_never_leaves_half_a_workflow(tmp_path):
    producer = _Counting()
    table = _table(Mode(name="count", producer="counting"), counting=producer)
    dest = tmp_path / "task_00" / "workflow"
    request = ProduceRequest(instruction="pick up the milk")
    assert produce(table.producer("count"), request, dest) > 0
    assert produce(producer, request, dest) == 0.0  # produced before: reused
    assert producer.calls == 1
    meta = json.loads((dest / PRODUCED_FILE).read_text())
    assert meta["source"] == "counting" and meta["produce_s"] > 0
    assert json.loads((dest / "workflow.json").read_text())["description"] == "pick up the milk"

    broken = tmp_path / "task_01" / "workflow"
    with pytest.raises(GapError, match="could not write it"):
        produce(_Counting(fail=True), request, broken)
    assert not broken.exists()
    assert [p.name for p in broken.parent.iterdir()] == [".produce_workflow"]  # the lock only


REHEARSAL_CONFTEST = """
from pytest_gap.modes import Mode
from pytest_gap.producers.prebuilt import Prebuilt


class Rehearsal(Prebuilt):
    def write(self, request, directory):
        return {**super().write(request, directory), "rehearsed": True}


@pytest.hookimpl(optionalhook=True)
def pytest_gap_modes(config):
    return [Mode(name="rehearsal", producer="rehearsal", description="test-only")]


@pytest.hookimpl(optionalhook=True)
def pytest_gap_producers(config):
    return {"rehearsal": Rehearsal}
"""


def _rehearsal_project(pytester, monkeypatch) -> None:
    """A project whose conftest.py adds the `rehearsal` mode (REHEARSAL_CONFTEST) and whose
    grid.yaml runs two seeds of it on the fake backend, with an idle-then-check workflow."""
    fake_conftest = (TESTS / "fake_conftest.py").read_text()
    pytester.makeconftest(fake_conftest + "\nimport pytest\n" + REHEARSAL_CONFTEST)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    workflow = pytester.path / "rehearse"
    workflow.mkdir()
    (workflow / "workflow.json").write_text(
        json.dumps(
            {
                "version": 1,
                "name": "rehearse",
                "description": "rehearses {{target}}",
                "start": "idle",
                "nodes": {
                    "idle": {
                        "type": "tool",
                        "skill": "idle",
                        "inputs": {"steps": 4},
                        "next": "check",
                    },
                    "check": {"type": "tool", "skill": "check_success", "next": "route"},
                    "route": {
                        "type": "router",
                        "routes": [
                            {
                                "when": {"ref": "check.success", "op": "eq", "value": True},
                                "next": "ok",
                            }
                        ],
                        "default": "failed",
                    },
                    "ok": {"type": "end", "status": "success"},
                    "failed": {"type": "end", "status": "failure"},
                },
            }
        )
    )
    config = _grid(
        backend="fake_backend:FakeBackend",
        families=["fake"],
        variations=["easy"],
        modes=["rehearsal"],
        task_ids=[0],
        n_seeds=2,
        gate_threshold=0.0,
        output_dir="runs",
        mode_overrides={"rehearsal": {"workflow_dir": "rehearse"}},
    )
    (pytester.path / "grid.yaml").write_text(yaml.safe_dump(config))


def test_a_mode_added_by_a_conftest_runs_a_real_session(pytester, monkeypatch):
    """Adding a mode is adding a row and, if need be, a producer: a conftest returns
    `rehearsal` from pytest_gap_modes and its producer from pytest_gap_producers, and a
    benchmark runs it like any built-in mode, on the controller and xdist workers alike."""
    from pytest_gap.workflow.templates import task_placeholders

    _rehearsal_project(pytester, monkeypatch)
    result = pytester.runpytest_subprocess("grid.yaml", "-v", "-n", "2", timeout=120)
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "grid.yaml::rehearsal::fake/easy::task00::seed000 " in out and "FAILED" in out
    assert "grid.yaml::rehearsal::fake/easy::task00::seed001 " in out and "PASSED" in out
    (task_dir,) = (pytester.path / "runs").glob("*/rehearsal/fake/easy/task_00")
    for seed, status in ((0, "end_failure"), (1, "task_success")):
        record = json.loads((task_dir / f"seed_{seed:03d}/result.json").read_text())
        assert record["mode"] == "rehearsal" and record["exit_status"] == status
        assert record["worker"] in ("gw0", "gw1")
        assert record["workflow"] == "rehearsal/fake/easy/task_00/workflow"
    produced = json.loads((task_dir / "workflow" / PRODUCED_FILE).read_text())
    assert produced["source"] == str(pytester.path / "rehearse") and produced["rehearsed"] is True
    written = json.loads((task_dir / "workflow/workflow.json").read_text())
    target = task_placeholders("pick up the block 0 and place it in the bin")["target"]
    assert written["description"] == f"rehearses {target}"


def test_gap_benchmark_and_the_api_know_a_mode_a_conftest_adds(pytester, monkeypatch):
    """`gap benchmark` and `benchmark.run` check and plan a config before any session starts:
    they read the mode table that session will build (its conftest.py and plugins), so a mode
    a conftest adds runs through them as it does under pytest, and a typo is still refused."""
    from pytest_gap import benchmark

    _rehearsal_project(pytester, monkeypatch)
    monkeypatch.chdir(pytester.path)
    monkeypatch.syspath_prepend(TESTS)  # the config's fake_backend, checked in this process
    assert "rehearsal" in benchmark.mode_table_of_session(pytester.path / "grid.yaml").names()

    result = pytester.run(
        sys.executable, "-m", "pytest_gap.cli", "benchmark", "grid.yaml", "--gate", timeout=180
    )
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, out
    assert "PASS" in out and "1/2" in out, out

    summary = benchmark.run(pytester.path / "grid.yaml", quiet=True, output_dir="api-runs")
    assert summary.n_trials == 2 and summary.n_success == 1
    assert [cell.mode for cell in summary.cells] == ["rehearsal"]

    config = yaml.safe_load((pytester.path / "grid.yaml").read_text())
    config["benchmark"]["modes"] = ["rehearsl"]
    (pytester.path / "typo.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"benchmark\.modes.*rehearsl.*rehearsal"):
        benchmark.run(pytester.path / "typo.yaml", quiet=True)
