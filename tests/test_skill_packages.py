"""User skill packages (pytest_gap/skills/packages.py), as a user adds them: an installed
distribution's `pytest_gap.skills` entry point, or a config's `skills.packages` (a module or a
directory). Their skills join `gap skills --json` and the LLM's catalogue with typed inputs,
outputs and failures, run in every xdist worker, and a broken package is one config line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.fake_session import CHECK_TAIL, workflow

TESTS = Path(__file__).resolve().parent
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"

WAVE = '''
from pydantic import BaseModel

from pytest_gap.skills.registry import SkillFailure, skill


class Waved(BaseModel):
    times: int


@skill(scene=False)
def wave(ctx, times: int = 2) -> Waved:
    """Wave the gripper open and shut `times` times. Fails when times is negative."""
    if times < 0:
        raise SkillFailure("cannot wave a negative number of times")
    for _ in range(times):
        ctx.act([0.0] * 6 + [1.0])
    return Waved(times=times)
'''

NUDGE = '''
from pydantic import BaseModel

from pytest_gap.skills.registry import skill


class Nudged(BaseModel):
    steps: int


@skill(scene=False)
def nudge(ctx, steps: int) -> Nudged:
    """Hold still for `steps` control steps."""
    for _ in range(steps):
        ctx.act([0.0] * 6 + [-1.0])
    return Nudged(steps=steps)
'''


def installed(site: Path, module: str, source: str, value: str | None = None) -> Path:
    """`module` on `site`, declared by a distribution under the pytest_gap.skills group."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(source)
    dist = site / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[pytest_gap.skills]\nx = {value or module}\n")
    return site


def run(*args: str, cwd: Path, path: list[Path] = ()) -> subprocess.CompletedProcess:
    pythonpath = [str(p) for p in path] + [str(TESTS), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def test_an_installed_skill_package_is_in_the_catalogue(tmp_path):
    site = installed(tmp_path / "site", "acme_skills", WAVE)
    out = run(GAP, "skills", "--json", cwd=tmp_path, path=[site])
    assert out.returncode == 0, out.stderr
    entries = {e["name"]: e for e in json.loads(out.stdout)}
    wave = entries["wave"]
    assert wave["inputs"]["properties"]["times"] == {
        "default": 2,
        "title": "Times",
        "type": "integer",
    }
    assert wave["outputs"]["required"] == ["times"]
    assert wave["failures"] == ["Fails when times is negative."]
    assert "pick" in entries  # the built-ins are still there
    # The LLM writing a workflow is offered it as any built-in.
    llm = run(
        sys.executable,
        "-c",
        "from pytest_gap.producers.llm import skill_summary;"
        "print([s for s in skill_summary() if s['name'] == 'wave'])",
        cwd=tmp_path,
        path=[site],
    )
    assert "'inputs': {'times': {'type': 'integer', 'required': False, 'default': 2}}" in llm.stdout


def _grid(tmp_path: Path, packages: list[str]) -> Path:
    (tmp_path / "wf").mkdir(exist_ok=True)
    graph = workflow(
        {
            "nudge": {"type": "tool", "skill": "nudge", "inputs": {"steps": 4}, "next": "check"},
            **CHECK_TAIL,
        },
        "nudge",
    )
    (tmp_path / "wf/workflow.json").write_text(json.dumps(graph))
    config = {
        "skills": {"packages": packages},
        "benchmark": {
            "backend": "fake_backend:FakeBackend",
            "families": ["fake"],
            "variations": ["easy"],
            "modes": ["workflow"],
            "task_ids": [0, 1],
            "n_seeds": 3,
            "gate_threshold": 0.5,
            "output_dir": "runs",
            "mode_overrides": {"workflow": {"workflow_dir": "wf"}},
        },
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_configs_skill_directory_runs_in_every_xdist_worker(tmp_path):
    (tmp_path / "my_skills").mkdir()
    (tmp_path / "my_skills/nudging.py").write_text(NUDGE)
    _grid(tmp_path, ["./my_skills"])
    listing = run(GAP, "skills", "bench.yaml", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "nudge(steps)  Hold still for `steps` control steps." in listing.stdout
    session = run(
        sys.executable, "-m", "pytest", "bench.yaml", "-p", "no:cacheprovider", "-n", "2",
        cwd=tmp_path,
    )  # fmt: skip
    assert session.returncode == 0, session.stdout + session.stderr
    records = [json.loads(p.read_text()) for p in tmp_path.glob("runs/*/**/result.json")]
    assert len(records) == 6 and not [r["error"] for r in records if r.get("error")]
    assert sum(r["success"] for r in records) == 4  # seeds 1 and 2 of each task
    assert len({r["worker"] for r in records}) == 2  # both workers ran the user skill


def test_a_skill_module_by_name_and_a_broken_one(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "nudge_skills.py").write_text(NUDGE)
    _grid(tmp_path, ["nudge_skills"])
    ok = run(GAP, "skills", "--json", "bench.yaml", cwd=tmp_path, path=[site])
    assert "nudge" in {e["name"] for e in json.loads(ok.stdout)}
    _grid(tmp_path, ["nudge_skills", "no_such_skills"])
    out = run(GAP, "benchmark", "bench.yaml", cwd=tmp_path, path=[site])
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("gap: error: ")
    assert (
        "bench.yaml: skills.packages[1]: skill package 'no_such_skills' failed to load "
        "(ModuleNotFoundError: No module named 'no_such_skills'); fix the package or remove it"
    ) in out.stderr
    assert not (tmp_path / "runs").exists()
    # A package that redefines a built-in skill is refused the same way.
    (site / "nudge_skills.py").write_text(NUDGE.replace("def nudge", "def pick"))
    _grid(tmp_path, ["nudge_skills"])
    clash = run(GAP, "skills", "bench.yaml", cwd=tmp_path, path=[site])
    assert clash.returncode == 2 and clash.stderr.count("\n") == 1, clash.stderr
    assert "skill package 'nudge_skills' failed to load (ValueError: skill pick registered" in (
        clash.stderr
    )


def test_a_broken_installed_package_is_one_line(tmp_path):
    site = installed(tmp_path / "site", "bad_skills", "raise RuntimeError('no GPU here')\n")
    out = run(GAP, "skills", cwd=tmp_path, path=[site])
    assert out.returncode == 2, out.stdout
    assert out.stderr == (
        "gap: error: entry point pytest_gap.skills:x = bad_skills: skill package 'bad_skills' "
        "failed to load (RuntimeError: no GPU here); fix the package or remove it\n"
    )
