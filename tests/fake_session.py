"""Real pytest sessions (pytester subprocesses) on the fake backend (tests/fake_backend.py).

The harness runs for real: collection, xdist, the watchdog, slots, the result files, the gate.
Only the simulator is the double, so a session costs pytest's start-up plus whatever step cost
(GAP_TEST_FAKE_STEP_S) a test asks for, not LIBERO's seconds per env.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

TESTS = Path(__file__).resolve().parent
CONFTEST = TESTS / "fake_conftest.py"
BACKEND = "fake_backend:FakeBackend"  # as a session names it (tests/ is on its PYTHONPATH)
TIMEOUT = 120


def workflow(nodes: dict, start: str, name: str = "w") -> dict:
    return {"version": 1, "name": name, "start": start, "nodes": nodes}


# Ends at once as a failure: a trial that runs on any backend, with no skill and no step.
GIVE_UP = workflow({"failed": {"type": "end", "status": "failure"}}, "failed", "give_up")


def write_workflow(directory: Path, graph: dict) -> Path:
    """`graph` as `directory`/workflow.json; returns the directory (a workflow_dir)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "workflow.json").write_text(json.dumps(graph))
    return directory


# The tail test workflows end with: ask the goal check (node `check`), end in success or failure.
CHECK_TAIL = {
    "check": {"type": "tool", "skill": "check_success", "next": "route"},
    "route": {
        "type": "router",
        "routes": [{"when": {"ref": "check.success", "op": "eq", "value": True}, "next": "ok"}],
        "default": "failed",
    },
    "ok": {"type": "end", "status": "success"},
    "failed": {"type": "end", "status": "failure"},
}

# idle a few steps, then ask the goal check: succeeds (during idle) on seeds the fake says so.
IDLE_THEN_CHECK = workflow(
    {
        "idle": {"type": "tool", "skill": "idle", "inputs": {"steps": 4}, "next": "check"},
        **CHECK_TAIL,
    },
    "idle",
)


class FakeSession:
    """A pytester dir whose sessions run on the fake backend, with workflow `wf` (idle, then
    check success) in place. `modules` lists the simulator modules each process imported;
    `envs` has one line per env made (tests/fake_backend.py's GAP_TEST_FAKE_ENVS)."""

    def __init__(self, pytester):
        self.pytester, self.path = pytester, pytester.path
        pytester.makeconftest(CONFTEST.read_text())
        self.modules = self.path / "modules.jsonl"
        self.envs = self.path / "envs.jsonl"
        path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
        self.setenv(
            PYTHONPATH=path, GAP_TEST_FAKE_MODULES=self.modules, GAP_TEST_FAKE_ENVS=self.envs
        )
        self.workflow("wf", IDLE_THEN_CHECK)

    def setenv(self, **env) -> None:
        """Set (or with None, unset) variables for this and later sessions of the test."""
        for key, value in env.items():
            if value is None:
                self.pytester._monkeypatch.delenv(key, raising=False)
            else:
                self.pytester._monkeypatch.setenv(key, str(value))

    def workflow(self, name: str, data: dict) -> str:
        (self.path / name).mkdir(parents=True, exist_ok=True)
        (self.path / name / "workflow.json").write_text(json.dumps(data))
        return str(self.path / name)

    def config(self, data: dict, name: str = "bench.yaml") -> Path:
        path = self.path / name
        path.write_text(yaml.safe_dump(data))
        return path

    def run(self, *args, timeout: float = TIMEOUT, **env):
        self.setenv(**env)
        return self.pytester.runpytest_subprocess(*args, timeout=timeout)

    def run_inprocess(self, *args, **env):
        """The session in this process: for what is not process-level (no xdist, kills,
        signals or exit of the interpreter), without a fresh interpreter's ~1 s start. The
        fake backend is found on sys.path here (PYTHONPATH only reaches subprocesses)."""
        self.setenv(**env)
        self.pytester._monkeypatch.syspath_prepend(str(TESTS))
        return self.pytester.runpytest_inprocess(*args)

    def run_dir(self, output: str = "runs") -> Path:
        dirs = sorted(p for p in (self.path / output).iterdir() if p.is_dir())
        assert len(dirs) == 1, dirs
        return dirs[0]

    @staticmethod
    def results(run_dir: Path) -> dict[str, dict]:
        return {
            p.parent.relative_to(run_dir).as_posix(): json.loads(p.read_text())
            for p in run_dir.rglob("result.json")
        }

    def env_records(self) -> list[dict]:
        return [json.loads(x) for x in self.envs.read_text().splitlines()]

    def loaded_simulators(self) -> list[dict]:
        """The processes that imported a simulator module (none may, on the fake backend)."""
        records = [json.loads(line) for line in self.modules.read_text().splitlines()]
        return [r for r in records if r["simulator_modules"]] if records else [{"none": "recorded"}]
