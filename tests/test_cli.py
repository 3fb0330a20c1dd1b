"""The `gap` console script, run as a user runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.fake_session import CHECK_TAIL

PICK_PLACE = Path(__file__).resolve().parent.parent / "examples/workflows/pick_place"
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"


def _gap(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([GAP, *args], capture_output=True, text=True, timeout=120)


def test_gap_help_lists_every_command_in_one_order():
    """The commands live in one module per group (pytest_gap/cli/); `gap --help` still lists
    them in the order it always has, not by group."""
    from pytest_gap.cli import HELP_ORDER

    out = _gap("--help")
    assert out.returncode == 0
    assert "{" + ",".join(HELP_ORDER) + "}" in out.stdout
    lines = out.stdout.splitlines()
    listed = [line.split()[0] for line in lines if line[:4] == "    " and line[4:5].isalpha()]
    assert listed == list(HELP_ORDER)


def _commands(parser, prefix="gap"):
    """(command path, its help, its parser) for every `gap` command at every level."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", helps.get(name), sub
                yield from _commands(sub, f"{prefix} {name}")


def test_every_command_and_argument_at_every_level_says_what_it_does():
    """`gap --help` at any depth (and the CLI reference generated from the same parser) has a
    line for everything: an argument added without a help string fails here, named."""
    import argparse

    from pytest_gap.cli import build_parser

    silent = []
    for path, text, parser in _commands(build_parser()):
        if not text:
            silent.append(path)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not action.help:
                silent.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert silent == []


def test_the_cli_reference_has_every_level_and_every_default():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    try:
        from docs_hooks import cli_reference
    finally:
        sys.path.pop(0)
    from pytest_gap.cli import build_parser

    page = cli_reference()
    paths = [path for path, _, _ in _commands(build_parser())]
    assert {"gap policy serve", "gap online serve", "gap online submit"} <= set(paths)
    assert all(f"## {path}\n" in page for path in paths)
    online = page.split("## gap online serve\n")[1].split("## ")[0]
    assert "| `--port` | the port to listen on | `8780` |" in online
    assert "| `--capacity` | evaluation servers at once | `1` |" in online


def test_starting_gap_or_the_pytest_plugin_imports_nothing_it_does_not_run():
    """Every `gap` command and every pytest session (each xdist worker too) starts by importing
    these; the parser and the plugin stay light (numpy alone is a tenth of a second a process),
    and a command imports what it runs when it runs."""
    script = (
        "import sys, pytest_gap.cli; print(sorted(m for m in {} if m in sys.modules))\n"
        "import pytest_gap.plugin; print(sorted(m for m in {} if m in sys.modules))"
    ).format(
        ("numpy", "pydantic", "yaml", "pytest", "pytest_gap.config", "pytest_gap.sim.backend"),
        ("numpy", "mujoco", "robosuite", "pyarrow", "scipy", "pytest_gap.run.trial"),
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]"]


def test_gap_suites_lists_registry_and_one_suites_tasks():
    listing = _gap("suites")
    assert listing.returncode == 0
    assert "libero_object_swap" in listing.stdout and "libero_90" in listing.stdout
    one = _gap("suites", "libero_object")
    assert one.returncode == 0
    assert "10 tasks, max_steps 280" in one.stdout
    assert "50 init states  pick up the bbq sauce and place it in the basket" in one.stdout


def test_gap_families_maps_variations_to_suites():
    out = _gap("families")
    assert out.returncode == 0
    lines = {line.split()[0]: line.split()[2] for line in out.stdout.splitlines()}
    assert lines["posvar/basket_swap"] == "libero_object"
    assert lines["libero_pro/object_swap"] == "libero_object_swap"


def test_unknown_suite_exits_2_with_one_line():
    out = _gap("suites", "libero_objekt")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "did you mean libero_object" in out.stderr


def test_gap_skills_lists_the_catalogue():
    out = _gap("skills")
    assert out.returncode == 0
    assert any(line.startswith("locate(name)") for line in out.stdout.splitlines())
    import json

    entries = {e["name"]: e for e in json.loads(_gap("skills", "--json").stdout)}
    assert set(entries) >= {"pick", "place", "next_step", "open_fixture", "turn_on", "push"}
    # An LLM writing a graph learns when each skill takes its on_error edge.
    assert any("naming the candidates" in f for f in entries["pick"]["failures"])
    assert any("cannot be read" in f for f in entries["next_step"]["failures"])
    assert all(entries[n]["failures"] for n in ("place", "open_fixture", "close_fixture", "push"))
    assert entries["home"]["failures"] == []
    assert any("policy_cameras" in f for f in entries["check_success"]["failures"])


def test_gap_run_prints_outcome_trace_and_video(tmp_path):
    video = tmp_path / "ep.mp4"
    out = subprocess.run(
        [
            GAP,
            "run",
            "examples/workflows/pick_place",
            "--family",
            "posvar",
            "--variation",
            "basket_swap",
            "--task",
            "7",
            "--seed",
            "2",
            "--video",
            str(video),
            "--trace-dir",
            str(tmp_path / "trace"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "SUCCESS  posvar/basket_swap task 7 seed 2"
    assert "pick up the milk and place it in the basket" in out.stdout
    assert f"  trace       {tmp_path / 'trace' / 'dag_trace.json'}" in lines
    assert (tmp_path / "trace" / "dag_trace.json").is_file() and video.stat().st_size > 0


def test_gap_run_reports_bad_inputs_in_one_line(tmp_path):
    out = _gap(
        "run",
        "examples/workflows/pick_place",
        "--family",
        "posvar",
        "--variation",
        "pos-var",
        "--task",
        "0",
        "--seed",
        "0",
    )
    assert out.returncode == 2 and "did you mean pos_var" in out.stderr
    assert out.stderr.strip().count("\n") == 0


def test_gap_run_names_a_shipped_template(tmp_path):
    """--template runs a template from the installed package through the prebuilt producer: its
    placeholders are filled and checked as in a benchmark (policy_only needs {{policy_id}})."""
    common = ["--family", "libero", "--variation", "object", "--task", "0", "--seed", "0"]
    unknown = _gap("run", "--template", "policy_onyl", *common)
    assert unknown.returncode == 2
    assert unknown.stderr == (
        "gap: error: unknown template 'policy_onyl'; did you mean 'policy_only'?\n"
    )
    both = _gap("run", "examples/workflows/pick_place", "--template", "policy_only", *common)
    assert both.returncode == 2
    assert both.stderr == (
        "gap: error: gap run: give a workflow directory or --template NAME (one of them)\n"
    )
    unfilled = _gap("run", "--template", "policy_only", "--trace-dir", str(tmp_path), *common)
    assert unfilled.returncode == 2, unfilled.stdout + unfilled.stderr
    assert "pytest_gap/templates/policy_only/workflow.json" in unfilled.stderr
    assert "placeholder {{policy_id}} is not filled; provide a value for 'policy_id'" in (
        unfilled.stderr
    )


CHECK_ONLY = {
    "version": 1,
    "name": "check_only",
    "description": "checks {{target}}",
    "start": "check",
    "nodes": CHECK_TAIL,
}


def test_gap_run_is_the_harness_trial(tmp_path):
    """`gap run` runs a trial through the harness's trial code (backend seam included), so it
    reports what a benchmark session records for the same workflow, backend, task and seed."""
    import json
    import os

    import yaml

    tests = Path(__file__).resolve().parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]),
    }
    (tmp_path / "wf").mkdir()
    (tmp_path / "wf/workflow.json").write_text(json.dumps(CHECK_ONLY))
    grid = {
        "benchmark": {
            "backend": "fake_backend:FakeBackend",
            "families": ["fake"],
            "variations": ["easy"],
            "modes": ["workflow"],
            "task_ids": [2],
            "seeds": [4],
            "gate_threshold": 0.0,
            "output_dir": "runs",
            "mode_overrides": {"workflow": {"workflow_dir": "wf"}},
        }
    }
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(grid))
    session = subprocess.run(
        [sys.executable, "-m", "pytest", "bench.yaml", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert session.returncode == 0, session.stdout + session.stderr  # the gate (0.0) passes
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("runs/*/**/result.json")]
    common = ["--family", "fake", "--variation", "easy", "--task", "2", "--seed", "4"]
    out = subprocess.run(
        [
            GAP,
            "run",
            "wf",
            "--backend",
            "fake_backend:FakeBackend",
            *common,
            "--trace-dir",
            "trace",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "FAILURE  fake/easy task 2 seed 4"
    assert lines[1] == f"  prompt      {record['env_prompt']}"
    assert lines[2].startswith(
        f"  completion  {record['completion']:.2f}   steps {record['steps']}   nodes 3   "
    )
    assert lines[3] == f"  exit        {record['exit_status']} at failed"
    assert lines[4] == "  trace       trace/dag_trace.json"
    assert (tmp_path / "trace/dag_trace.json").is_file()


def test_gap_schema_prints_the_benchmark_json_schema(tmp_path):
    import json

    out = _gap("schema")
    assert out.returncode == 0
    schema = json.loads(out.stdout)
    assert schema["title"] == "pytest-gap benchmark config"
    block = schema["$defs"]["BenchmarkBlock"]["properties"]
    assert block["n_seeds"]["default"] == 50 and block["gate_threshold"]["default"] == 0.9
    assert schema["$defs"]["BenchmarkBlock"]["additionalProperties"] is False


def test_every_shipped_benchmark_config_loads():
    from pytest_gap.config import load_config
    from pytest_gap.plan import all_trials, plan

    root = Path(__file__).resolve().parent.parent
    configs = sorted([*root.glob("benchmarks/*.yaml"), *root.glob("examples/benchmark/*.yaml")])
    assert len(configs) == 8
    for path in configs:
        assert all_trials(plan(load_config(path))), path
    embedded = [c for p in root.glob("benchmarks/*.yaml") for c in plan(load_config(p))]
    assert all(c.error is None for c in embedded)  # the main job runs every cell it plans
    # ... and shows the breadth: a task of every LIBERO suite the reference graphs cover.
    suites = {(c.family, c.variation) for c in embedded}
    assert suites >= {("libero", v) for v in ("object", "spatial", "goal", "10")}
    # The main job shows a policy A/B: one mode with two policies on the same tasks and seeds.
    pair = plan(load_config(root / "benchmarks/policy_ab.yaml"))
    ab = {(c.mode, c.policy_id): {t.id.split("::", 2)[-1] for t in c.trials()} for c in pair}
    rows = [k for k in ab if k[0] == "policy_only"]
    assert len(rows) == 2 and ab[rows[0]] == ab[rows[1]]
    # ... and a learned network, on init states its training never saw (40-49).
    learned = plan(load_config(root / "benchmarks/learned.yaml"))
    assert all(t.seed % 50 >= 40 for c in learned for t in c.trials())


def test_gap_benchmark_refuses_curobo_planner_before_any_trial(tmp_path):
    """cuRobo planning is not supported: asking for it is a config error, not a silent IK run."""
    config = tmp_path / "bench.yaml"
    config.write_text(
        "skills: {planner: curobo}\n"
        f"trials: {{output_dir: {tmp_path / 'runs'}}}\n"
        "benchmark: {families: [libero], variations: [object], modes: [workflow], task_ids: [0],"
        f" n_seeds: 1, mode_overrides: {{workflow: {{workflow_dir: {PICK_PLACE}}}}},"
        f" output_dir: {tmp_path / 'runs'}}}\n"
    )
    out = _gap("benchmark", str(config))
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().count("\n") == 0
    assert "skills.planner: cuRobo motion planning is not supported" in out.stderr
    assert "remove the key or set planner: ik" in out.stderr
    assert not (tmp_path / "runs").exists()  # no trial ran, no run dir was made
