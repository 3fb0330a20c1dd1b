"""A learned policy end to end, in its short form: the privileged oracle's episodes recorded as
a LeRobot dataset by a session, examples/policies/visuomotor.py trained on it by
examples/policies/train.py, and the checkpoint served by `gap policy serve torch` to a second
session that scores it. (The policy's quality is a benchmark figure, not asserted here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

from pytest_gap.policies.wire import metadata_digest
from pytest_gap.results import scan_results

ROOT = Path(__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def _session(where: Path, config: dict) -> Path:
    (where / "bench.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "bench.yaml", "-p", "no:cacheprovider", "-q"],
        cwd=where,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    (run,) = (where / "runs").iterdir()
    return run


def _grid(policy: dict, seeds: list[int], **trials) -> dict:
    return {
        "policies": {"p": policy},
        "trials": {"task_timeout_secs": 600, **trials},
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["policy_only"],
            "policies": ["p"],
            "task_ids": [0],
            "seeds": seeds,
            "output_dir": "runs",
            "gate_threshold": 0.0,
            "mode_overrides": {"policy_only": {"template": "policy_only"}},
        },
    }


def test_record_train_serve_score(tmp_path):
    demos = tmp_path / "demos"
    demos.mkdir()
    oracle = {"command": ["gap", "policy", "serve", "scripted", "--port", "{port}"]}
    dataset = {"image_size": 64, "every": 5, "only_success": True}
    run = _session(demos, _grid({**oracle, "privileged_state": True}, [0, 1], dataset=dataset))
    recorded = scan_results(run)
    successes = sorted(k for k, r in recorded.items() if r.success)
    assert successes, "the oracle succeeded on neither seed"
    episodes = pq.read_table(run / "dataset/meta/episodes/chunk-000/file-000.parquet")
    assert episodes.column("gap/trial").to_pylist() == successes

    demos_dataset = run / "dataset"
    checkpoints = tmp_path / "ckpt"
    trained = subprocess.run(
        [
            *(sys.executable, "-m", "examples.policies.train", str(run / "dataset")),
            *("--out", str(checkpoints), "--epochs", "2", "--save", "1,2"),
            *("--image-size", "32", "--threads", "1"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    log = [json.loads(line) for line in (checkpoints / "train_log.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in log] == [1, 2] and all(e["loss"] > 0 for e in log)
    assert sorted(p.name for p in checkpoints.glob("*.pt")) == ["1.pt", "2.pt"]

    scored = tmp_path / "scored"
    scored.mkdir()
    learned = {
        "command": [
            *("gap", "policy", "serve", "torch", "--checkpoint", str(checkpoints / "2.pt")),
            *("--port", "{port}", "--threads", "1"),
        ],
        "env": {"PYTHONPATH": PYTHONPATH},
    }
    run = _session(scored, _grid(learned, [7], max_steps=20))
    (result,) = scan_results(run).values()
    assert not result.errored, result.error
    assert 0 < result.steps <= 20 and result.policy_digest  # the budget bounds it
    assert result.steps_file is not None
    # the record names the checkpoint that answered: its server's metadata frame, hashed
    frame = {
        "policy": "examples.policies.visuomotor:VisuomotorPolicy",
        "checkpoint": log[-1]["checkpoint"],
        "epoch": 2,
        "seed": 0,
        "samples": log[-1]["samples"],
    }
    assert result.policy_digest == metadata_digest(frame)

    # a DAgger round: the checkpoint acts, the oracle labels every query; the labels train
    labels = tmp_path / "labels"
    dagger = {
        "command": [
            *("gap", "policy", "serve", "examples.policies.dagger:DaggerPolicy"),
            *("--port", "{port}"),
        ],
        "privileged_state": True,
        "env": {
            "PYTHONPATH": PYTHONPATH,
            "GAP_DAGGER_CHECKPOINT": str(checkpoints / "2.pt"),
            "GAP_DAGGER_LABELS": str(labels),
        },
    }
    (tmp_path / "round").mkdir()
    run = _session(tmp_path / "round", _grid(dagger, [3], max_steps=20))
    (result,) = scan_results(run).values()
    assert not result.errored, result.error
    queries = sorted(labels.glob("*.npz"))
    assert len(queries) >= 20 // 5  # one label per query, the bring-up's steps excepted
    with np.load(queries[0]) as label:
        assert label["agentview"].shape == (32, 32, 3) and label["actions"].shape[1] == 7
    retrained = subprocess.run(
        [
            *(sys.executable, "-m", "examples.policies.train", str(demos_dataset)),
            *("--out", str(tmp_path / "ckpt2"), "--epochs", "1", "--save", "1"),
            *("--image-size", "32", "--threads", "1", "--labels", str(labels)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert retrained.returncode == 0, retrained.stderr[-3000:]
    (entry,) = [
        json.loads(x) for x in (tmp_path / "ckpt2/train_log.jsonl").read_text().splitlines()
    ]
    assert entry["samples"] == log[-1]["samples"] + len(queries)
