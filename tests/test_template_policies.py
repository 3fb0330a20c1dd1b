"""Policies reached through templates and workflows, in real sessions on the fake backend with
real policy servers on loopback: a template mode that names no policy boots the pi05-libero
preset (the spec's implicit fallback) and says so first; a suites-mode config boots the managed
policies its workflows' run_policy nodes name, as a grid config boots its policy axis."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from tests.fake_session import BACKEND, CHECK_TAIL, FakeSession, workflow

pytest_plugins = ["pytester"]

GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"


def run_policy(policy: str) -> dict:
    """A workflow of one run_policy node (two short windows), then the goal check."""
    node = {"policy": policy, "max_windows": 2, "replan_every": 4}
    act = {"type": "tool", "skill": "run_policy", "inputs": node, "next": "check"}
    return workflow({"act": act, **CHECK_TAIL}, "act", "run_policy")


def fake_openpi(root: Path) -> dict:
    """An openpi checkout (scripts/serve_policy.py) and a `uv` on PATH that, for the preset's
    `uv run scripts/serve_policy.py --port P ...`, logs its argv and serves `gap policy serve
    hold` on P: the preset's command, run as the harness runs it, without openpi."""
    (root / "openpi/scripts").mkdir(parents=True)
    (root / "openpi/scripts/serve_policy.py").write_text("")
    (root / "bin").mkdir()
    uv = root / "bin/uv"
    uv.write_text(
        "#!/bin/sh\n"
        f'echo "$PWD $@" > {root / "uv_argv.txt"}\n'
        f'exec {sys.executable} -m pytest_gap.cli policy serve hold --port "$4"\n'
    )
    uv.chmod(0o755)
    return {
        "GAP_OPENPI_DIR": root / "openpi",
        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}",
    }


def test_a_template_mode_without_a_policy_boots_the_pi05_libero_preset(pytester):
    fake = FakeSession(pytester)
    act = fake.workflow("act", run_policy("{{policy_id}}"))
    fake.config(
        {
            "benchmark": {
                "backend": BACKEND,
                "families": ["fake"],
                "variations": ["easy"],
                "modes": ["policy_only"],
                "task_ids": [0],
                "seeds": [1],
                "gate_threshold": 0.0,
                "output_dir": "runs",
                "mode_overrides": {"policy_only": {"workflow_dir": act}},
            }
        }
    )
    env = fake_openpi(pytester.path)
    result = fake.run("bench.yaml", **env)
    out = result.stdout.str()
    assert result.ret == 0, out
    line = (
        "gap: bench.yaml: mode policy_only names no policy (benchmark.policies, "
        "benchmark.mode_overrides.policy_only.policy_id): it runs the pi05-libero preset, the "
        "spec's implicit fallback"
    )
    assert line in out.splitlines()
    assert out.index(line) < out.index("collected")  # said before the session starts
    cwd, *argv = (pytester.path / "uv_argv.txt").read_text().split()
    assert cwd == str(pytester.path / "openpi") and argv[:3] == [
        "run",
        "scripts/serve_policy.py",
        "--port",
    ]
    assert "--policy.config=pi05_libero" in argv
    (record,) = fake.results(fake.run_dir()).values()
    assert record["policy_id"] == "pi05-libero" and not record["infra_failure"], record
    assert record["policy_url"] == f"ws://127.0.0.1:{argv[3]}"


def test_a_suites_config_boots_the_managed_policies_its_workflows_name(pytester):
    fake = FakeSession(pytester)
    act = fake.workflow("act", run_policy("hold"))
    fake.config(
        {
            "backend": BACKEND,
            "policies": {
                "hold": {"command": [GAP, "policy", "serve", "hold", "--port", "{port}"]},
                "unused": {"command": ["no-such-program-here"]},
            },
            "trials": {"output_dir": "runs"},
            "suites": [{"suite_name": "fake_easy", "task_ids": [0], "seeds": [1, 2],
                        "workflow_dir": act}],
            "gate_threshold": 0.0,
        }
    )  # fmt: skip
    result = fake.run("bench.yaml")
    out = result.stdout.str()
    assert result.ret == 0, out
    run_dir = fake.run_dir()
    records = fake.results(run_dir)
    assert len(records) == 2
    for key, record in records.items():
        assert not record["infra_failure"] and record["error"] is None, record
        trace = json.loads((run_dir / key / "trace/dag_trace.json").read_text())
        assert {n["id"]: n["status"] for n in trace["nodes"]}["act"] == "ok"
    # hold was booted for the workflow that names it; the entry nobody names was not
    assert sorted(p.name for p in (run_dir / "policy_logs").glob("*.log")) == ["policy_hold.log"]
