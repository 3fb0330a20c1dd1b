"""Benchmark YAML loading: both shapes, defaults, and every class of user error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pytest_gap.config import (
    DEFAULT_MODES,
    ConfigError,
    json_schema,
    load_config,
    parse_config,
)

ROOT = Path(__file__).resolve().parent.parent
PICK_PLACE = ROOT / "examples/workflows/pick_place"


def _write(tmp_path: Path, data, name: str = "bench.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def _problems(tmp_path: Path, data) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, data))
    return info.value.problems


def test_grid_defaults_follow_the_spec(tmp_path):
    config = load_config(_write(tmp_path, {"benchmark": {}}))
    block = config.benchmark
    assert config.shape == "grid"
    assert block.families == ["posvar"] and block.variations is None
    assert tuple(block.modes) == DEFAULT_MODES
    assert (block.n_tasks, block.n_seeds, block.num_workers) == (10, 50, 8)
    assert block.policies == [] and block.gate_threshold == 0.90
    assert config.rule == "point"  # the spec's gate unless gate_rule: wilson
    assert block.record_video is None  # inherits trials.record_video
    assert block.output_dir == tmp_path / "benchmark_runs"  # relative to the YAML
    assert config.trials.task_timeout_secs == 0
    assert config.llm.provider == "openrouter" and config.llm.temperature == 0.7
    assert config.llm.max_concurrent_requests == 4
    assert config.policy_manager.startup_timeout_s == 120
    assert config.policy_manager.evict_grace_s == 10


def test_suites_shape_and_aliases(tmp_path):
    config = load_config(
        _write(
            tmp_path,
            {
                "trials": {"total": 3, "output_dir": "out"},
                "suites": [
                    {
                        "suite_name": "libero_object",
                        "task_prompts": {2: "pick up the milk and place it in the basket"},
                        "objects": {"target": "milk"},
                        "workflow_dir": str(PICK_PLACE),
                    }
                ],
                "gate_threshold": 0.5,
                "gate_rule": "wilson",
                "policies": {"mine": {"start_cmd": "serve --port {port}"}},
            },
        )
    )
    assert config.shape == "suites" and config.threshold == 0.5 and config.rule == "wilson"
    assert config.trials.trials_per_generation == 3  # `total` is an alias
    assert config.output_dir == tmp_path / "out"
    assert config.policies["mine"].command == "serve --port {port}"
    assert config.suites[0].task_prompts == {2: "pick up the milk and place it in the basket"}


def test_every_problem_is_reported_at_once_with_its_key(tmp_path):
    problems = _problems(
        tmp_path,
        {
            "base": "other.yaml",
            "trails": {},
            "benchmark": {
                "familys": ["posvar"],
                "families": ["posvr"],
                "modes": ["workflo"],
                "n_seeds": 0,
                "policies": ["ghost"],
                "mode_overrides": {"workflow": {"workflow_dir": "missing_dir"}},
            },
        },
    )
    text = "\n".join(problems)
    assert len(problems) == 8, text
    assert "base: benchmark YAMLs are standalone" in text
    assert "trails: unknown key; did you mean 'trials'?" in text
    assert "benchmark.familys: unknown key; did you mean 'families'?" in text
    assert "benchmark.families: unknown family 'posvr'; did you mean 'posvar'?" in text
    assert "benchmark.modes: unknown mode 'workflo'; did you mean 'workflow'?" in text
    assert "benchmark.n_seeds: Input should be greater than 0" in text
    assert "benchmark.policies: 'ghost' is not in the policies: registry" in text
    assert "benchmark.mode_overrides.workflow.workflow_dir:" in text and "no workflow.json" in text


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"trials": {}}, "neither a benchmark: block (grid mode) nor a non-empty suites: list"),
        ("benchmark: [unclosed", "not valid YAML"),
        ("- a list", "must hold a mapping"),
        ({"suites": [{"suite_name": "libero_objct"}]}, "did you mean 'libero_object'?"),
        ({"suites": [{"suite_name": "posvar/nope"}]}, "unknown variation 'nope' of family posvar"),
        ({"benchmark": {"task_ids": [0, 0]}}, "benchmark.task_ids: an id is listed twice"),
        ({"benchmark": {"seeds": [-1]}}, "benchmark.seeds: ids are 0-based"),
        ({"benchmark": {"gate_threshold": 1.5}}, "benchmark.gate_threshold: Input should be less"),
        (
            {"benchmark": {"gate_rule": "strict"}},
            "benchmark.gate_rule: Input should be 'point', 'wilson' or 'sequential' (got 'strict')",
        ),
        (
            {"suites": [{"suite_name": "libero_object"}], "gate_rule": "Wilson"},
            "gate_rule: Input should be 'point', 'wilson' or 'sequential' (got 'Wilson')",
        ),
        (
            {"benchmark": {}, "policies": {"p": {"url": "ws://x", "preset": "pi05-libero"}}},
            "policies.p: set exactly one of url, command (or start_cmd), preset",
        ),
        ({"benchmark": {}, "llm": {"provider": "anthropic"}}, "llm.provider: Input should be"),
        (
            {"benchmark": {}, "trials": {"ray": {"num_gpus": -1}}},
            "trials.ray.num_gpus: Input should be greater than or equal to 0",
        ),
        (
            {"benchmark": {}, "trials": {"ray": {"num_cpus": 0}}},
            "trials.ray: num_cpus and num_gpus are both 0",
        ),
        (
            {"benchmark": {}, "policies": {"p": {"url": "ws://h:1", "ray": {"num_gpus": 1}}}},
            "policies.p: ray places a server the session starts (command or preset); a url: "
            "server runs wherever it was started: drop ray or give a command",
        ),
        (
            {"benchmark": {}, "policies": {"p": {"preset": "pi05-libero", "ray": {"gpus": 1}}}},
            "policies.p.ray.gpus",
        ),
        (
            {"benchmark": {"variations": ["object"], "families": ["posvar"]}},
            "benchmark.variations: unknown variation of the chosen families 'object'",
        ),
        # a submission's key in a session: the seeds it stands for are the server's alone
        ({"benchmark": {}, "split": "test"}, "split: only a config submitted to an evaluation"),
        ({"benchmark": {}, "split": "tset"}, "split: Input should be 'val_train'"),
    ],
)
def test_user_errors_name_the_key(tmp_path, data, expected):
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert expected in str(info.value)
    assert all(line.startswith(f"{path}: ") for line in str(info.value).splitlines())


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "absent.yaml")


def test_echo_never_carries_secrets():
    config = parse_config(
        {
            "benchmark": {},
            "llm": {"api_key": "sk-secret-123"},
            "policies": {"p": {"url": "ws://h:1", "env": {"TOKEN": "tok-456"}}},
        }
    )
    text = json.dumps(config.echo())
    assert "sk-secret-123" not in text and "tok-456" not in text


def test_json_schema_describes_both_shapes():
    schema = json_schema()
    assert {"benchmark", "suites", "trials", "llm", "policies"} <= set(schema["properties"])
    assert "source" not in schema["properties"]
    json.dumps(schema)


def test_trials_max_steps_reaches_every_cell_and_must_be_positive(tmp_path):
    from pytest_gap.plan import plan

    grid = {"trials": {"max_steps": 12}, "benchmark": {"families": ["libero"], "n_seeds": 1}}
    suites = {"trials": {"max_steps": 12}, "suites": [{"suite_name": "libero_object"}]}
    for data in (grid, suites):
        cells = plan(load_config(_write(tmp_path, data)))
        assert cells and {c.max_steps for c in cells} == {12}
    assert {c.max_steps for c in plan(load_config(_write(tmp_path, {"benchmark": {}})))} == {None}
    (problem,) = _problems(tmp_path, {"trials": {"max_steps": 0}, "benchmark": {}})
    assert problem.startswith("trials.max_steps") and "greater than 0" in problem
