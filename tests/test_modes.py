"""The mode table and the producers: a mode is a row, templates ship in the package, and a
workflow is produced once per destination, atomically, whatever producer writes it."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

import pytest
import yaml

import pytest_gap
from pytest_gap import modes
from pytest_gap.config import ConfigError, parse_config
from pytest_gap.errors import GapError
from pytest_gap.modes import Mode, get_mode, register_mode
from pytest_gap.plan import plan
from pytest_gap.producers import base
from pytest_gap.producers.base import PRODUCED_FILE, ProduceRequest, produce, register_producer
from pytest_gap.producers.templates import template_dir, template_names

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
POLICIES = {"pi05": {"url": "ws://h:1"}, "molmo": {"url": "ws://h:2"}}


@pytest.fixture
def table(monkeypatch):
    """The mode and producer tables, restored after the test."""
    monkeypatch.setattr(modes, "_MODES", dict(modes._MODES))
    monkeypatch.setattr(base, "_PRODUCERS", dict(base._PRODUCERS))


def _grid(**block) -> dict:
    block = {"families": ["libero"], "variations": ["object"], "n_tasks": 1, "n_seeds": 1, **block}
    return {"benchmark": block, "policies": POLICIES}


def test_the_built_in_rows():
    assert modes.mode_names() == ("llm_generation", "llm_plus_policy", "policy_only", "workflow")
    assert modes.default_modes() == ("llm_generation", "llm_plus_policy", "policy_only")
    axis = {name: get_mode(name).takes_policy_axis for name in modes.mode_names()}
    assert axis == {
        "llm_generation": False,
        "llm_plus_policy": True,
        "policy_only": True,
        "workflow": False,
    }
    assert [n for n in modes.mode_names() if get_mode(n).needs_llm] == ["llm_generation"]
    assert not get_mode("llm_generation").needs_workflow and get_mode("workflow").needs_workflow


def test_a_registered_row_drives_validation_the_policy_axis_and_cell_errors(table):
    config = _grid(modes=["ab_probe"], mode_overrides={"ab_probe": {"template": "policy_only"}})
    with pytest.raises(ConfigError, match=r"benchmark\.modes: unknown mode 'ab_probe'"):
        parse_config(config, "grid.yaml", base=ROOT)

    register_mode(Mode(name="ab_probe", producer="prebuilt", takes_policy_axis=True))
    register_mode(Mode(name="ab_probe", producer="prebuilt", takes_policy_axis=True))  # no-op
    with pytest.raises(GapError, match="'ab_probe' is already registered"):
        register_mode(Mode(name="ab_probe", producer="llm"))

    config["benchmark"]["policies"] = ["pi05", "molmo"]
    cells = plan(parse_config(config, "grid.yaml", base=ROOT))
    assert [(c.row, c.error) for c in cells] == [("ab_probe@pi05", None), ("ab_probe@molmo", None)]
    assert cells[0].workflow_dir == template_dir("policy_only")
    assert not cells[0].needs_llm

    del config["benchmark"]["mode_overrides"]
    (cell, _) = plan(parse_config(config, "grid.yaml", base=ROOT))
    assert cell.error == (
        "benchmark.mode_overrides.ab_probe.workflow_dir is not set: the ab_probe mode runs that "
        "workflow directory; set it (e.g. examples/workflows/pick_place)"
    )


def test_a_row_whose_producer_is_the_llm_needs_the_llm(table, monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    register_mode(Mode(name="draft", producer="llm"))
    (cell,) = plan(parse_config(_grid(modes=["draft"]), "grid.yaml", base=ROOT))
    assert cell.uses_llm and "llm.model is not set" in cell.error


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


def test_produce_writes_once_and_never_leaves_half_a_workflow(tmp_path, table):
    producer = _Counting()
    register_producer("counting", producer)
    dest = tmp_path / "task_00" / "workflow"
    request = ProduceRequest(instruction="pick up the milk")
    assert produce(base.producer_for("counting"), request, dest) > 0
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


def test_a_mode_added_by_a_conftest_runs_a_real_session(pytester):
    """Adding a mode is adding a row: a conftest registers `rehearsal` (prebuilt producer, no
    policy axis) and a benchmark runs it on real LIBERO like any built-in mode."""
    pytester.makeconftest(
        """
        from pytest_gap.modes import Mode, register_mode

        register_mode(Mode(name="rehearsal", producer="prebuilt", description="test-only"))
        """
    )
    workflow = pytester.path / "give_up"
    workflow.mkdir()
    (workflow / "workflow.json").write_text(
        json.dumps(
            {
                "version": 1,
                "name": "give_up",
                "description": "gives up on {{target}}",
                "start": "home",
                "nodes": {
                    "home": {"type": "tool", "skill": "home", "next": "failed"},
                    "failed": {"type": "end", "status": "failure"},
                },
            }
        )
    )
    config = _grid(
        modes=["rehearsal"],
        task_ids=[0],
        gate_threshold=0.0,
        output_dir="runs",
        mode_overrides={"rehearsal": {"workflow_dir": "give_up"}},
    )
    (pytester.path / "grid.yaml").write_text(yaml.safe_dump(config))
    result = pytester.runpytest_subprocess("grid.yaml", "-v", timeout=300)
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "grid.yaml::rehearsal::libero/object::task00::seed000 FAILED" in out
    (task_dir,) = (pytester.path / "runs").glob("*/rehearsal/libero/object/task_00")
    record = json.loads((task_dir / "seed_000/result.json").read_text())
    assert record["mode"] == "rehearsal" and record["exit_status"] == "end_failure"
    assert record["workflow"] == "rehearsal/libero/object/task_00/workflow"
    produced = json.loads((task_dir / "workflow" / PRODUCED_FILE).read_text())
    assert produced["source"] == str(workflow)
    written = json.loads((task_dir / "workflow/workflow.json").read_text())
    assert written["description"] == "gives up on alphabet soup"
