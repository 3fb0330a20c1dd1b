"""episodes.parquet: one row per recorded trial of the run dir, rebuilt from every result.json
at the end of each session (like the summaries), for pandas, polars, DuckDB and `gap compare`.

Columns (snake_case; types are the explicit pyarrow `SCHEMA`: ints int64, flags bool, numbers
float64, the rest string; a nullable column is null where the record cannot say):

    run_id              the run dir's name (its YYYYMMDD_HHMMSS stamp)
    trial_dir           the trial's directory, relative to the run dir
    plan_digest         provenance.plan_digest of the config (output paths, recording, ... removed)
    cell_key            the cell's directory: <mode>[/<policy_id>]/<family>/<variation> or
                        suites/<suite_name>
    mode                the benchmark mode
    policy_id           the policy of a policy-axis cell (null: none)
    server_url          the url of that policy's server, secrets masked (null: none)
    policy_digest       sha256 of the metadata frame that server sent (null: none connected)
    backend             the simulator backend (a name or import string)
    family, variation   the cell's family and variation
    suite               the backend's suite the trial ran on
    task_id, seed       the trial (int64)
    init_state          the init state the seed chose (int64; null: the trial never reset)
    init_state_digest   sha256 of the sim state the episode started from (null: unknown)
    scene_digest        sha256 of the scene after the settle steps, fixtures included (null:
                        unknown; sim/backend.py scene_digest)
    prompt              the instruction as given to the workflow (or the policy)
    success             the simulator's goal check (bool)
    completion          the fraction of the goal met (float64)
    reward              1.0 on success (float64)
    steps               counted control steps (int64)
    exit_code           0 ran, 1 the harness could not run it, 124 watchdog, 137 worker died
    exit_status         how the workflow ended (null: it never ran)
    errored             the harness could not score it (bool; excluded from success rates)
    is_infra_failure    an infrastructure failure, not the policy's (bool)
    harness_faults      attempts of the trial a harness fault broke: the simulator, its renderer
                        or the host raised (int64; pytest_gap/faults.py)
    is_rerun_after_fault  the record is the re-run, on a fresh env, of an attempt a harness
                        fault broke (bool)
    wall_s              the trial's wall time in seconds (float64)
    harness_version     pytest-gap's version
    harness_surface     provenance.harness_surface's digest (code and packages deciding outcomes)
    packages            the simulator packages' versions, as canonical JSON text of
                        {distribution: version}: one string column reads the same in every
                        tool (a map column comes back as a list of pairs in pandas)
    worker              the xdist worker that ran it (null: a session without xdist)
    device              the EGL device its env rendered on, else the process's
                        MUJOCO_EGL_DEVICE_ID, else its CUDA_VISIBLE_DEVICES (null: none pinned)
    failure_label       how a failed episode failed, read from its per-step evidence
                        (sim/failure_labels.py; null: it succeeded, errored, or kept none)
    steps_file          its per-step evidence (steps.parquet, sim/step_log.py), relative to
                        the run dir (null: no step ran, or a record older than it)

pandas keeps int64 columns int64 unless they hold nulls (`init_state` before any reset); read
with `pd.read_parquet(path, dtype_backend="numpy_nullable")` to keep them integers then.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from pytest_gap import ids
from pytest_gap.layout import EPISODES
from pytest_gap.outputs.hook import hookimpl
from pytest_gap.results import TrialResult

SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("trial_dir", pa.string(), nullable=False),
        pa.field("plan_digest", pa.string()),
        pa.field("cell_key", pa.string(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),
        pa.field("policy_id", pa.string()),
        pa.field("server_url", pa.string()),
        pa.field("policy_digest", pa.string()),
        pa.field("backend", pa.string()),
        pa.field("family", pa.string(), nullable=False),
        pa.field("variation", pa.string(), nullable=False),
        pa.field("suite", pa.string(), nullable=False),
        pa.field("task_id", pa.int64(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("init_state", pa.int64()),
        pa.field("init_state_digest", pa.string()),
        pa.field("scene_digest", pa.string()),
        pa.field("prompt", pa.string()),
        pa.field("success", pa.bool_(), nullable=False),
        pa.field("completion", pa.float64(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("steps", pa.int64(), nullable=False),
        pa.field("exit_code", pa.int64(), nullable=False),
        pa.field("exit_status", pa.string()),
        pa.field("errored", pa.bool_(), nullable=False),
        pa.field("is_infra_failure", pa.bool_(), nullable=False),
        pa.field("harness_faults", pa.int64(), nullable=False),
        pa.field("is_rerun_after_fault", pa.bool_(), nullable=False),
        pa.field("wall_s", pa.float64(), nullable=False),
        pa.field("harness_version", pa.string()),
        pa.field("harness_surface", pa.string()),
        pa.field("packages", pa.string()),
        pa.field("worker", pa.string()),
        pa.field("device", pa.string()),
        pa.field("failure_label", pa.string()),
        pa.field("steps_file", pa.string()),
    ]
)


def device_of(devices: dict[str, str]) -> str | None:
    for key in ("env_egl_device", "MUJOCO_EGL_DEVICE_ID", "CUDA_VISIBLE_DEVICES"):
        if devices.get(key):
            return str(devices[key])
    return None


def episode_row(run_id: str, trial_dir: str, r: TrialResult) -> dict:
    """One record as a row of SCHEMA."""
    return {
        "run_id": run_id,
        "trial_dir": trial_dir,
        "plan_digest": r.plan_digest,
        "cell_key": ids.cell_of_key(trial_dir),
        "mode": r.mode,
        "policy_id": r.policy_id,
        "server_url": r.policy_url,
        "policy_digest": r.policy_digest,
        "backend": r.backend,
        "family": r.family,
        "variation": r.variation,
        "suite": r.suite,
        "task_id": r.task_id,
        "seed": r.seed,
        "init_state": r.init_state,
        "init_state_digest": r.init_state_digest,
        "scene_digest": r.scene_digest,
        "prompt": r.prompt,
        "success": r.success,
        "completion": r.completion,
        "reward": r.reward,
        "steps": r.steps,
        "exit_code": r.exit_code,
        "exit_status": r.exit_status,
        "errored": r.errored,
        "is_infra_failure": r.infra_failure,
        "harness_faults": r.harness_faults,
        "is_rerun_after_fault": r.rerun_after_fault,
        "wall_s": r.wall_s,
        "harness_version": r.harness_version,
        "harness_surface": r.harness_surface,
        "packages": json.dumps(r.packages, sort_keys=True, separators=(",", ":"))
        if r.packages
        else None,
        "worker": r.worker,
        "device": device_of(r.devices),
        "failure_label": r.failure_label,
        "steps_file": r.steps_file,
    }


def episodes_table(run_dir: Path, results: dict[str, TrialResult]) -> pa.Table:
    """The rows, read by Arrow's JSON reader against SCHEMA. Not built from Python objects:
    every conversion from them makes pyarrow import pandas (its pandas shim asks whether each
    value is a pandas object), 0.3 s at the end of every session for a library nothing here
    uses. A null in a column SCHEMA declares not null is refused, as the types are."""
    rows = [episode_row(run_dir.name, key, r) for key, r in sorted(results.items())]
    if not rows:
        return pa.Table.from_batches([], schema=SCHEMA)
    text = "".join(json.dumps(row) + "\n" for row in rows).encode()
    table = pa_json.read_json(
        io.BytesIO(text),
        read_options=pa_json.ReadOptions(use_threads=False, block_size=len(text) + 1),
        parse_options=pa_json.ParseOptions(
            explicit_schema=SCHEMA, unexpected_field_behavior="error"
        ),
    )
    return table.cast(SCHEMA)  # the reader makes every column nullable


def write_episodes(run_dir: Path, results: dict[str, TrialResult]) -> Path:
    """Write (atomically: temporary file, then rename) episodes.parquet over `results`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / EPISODES
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(episodes_table(run_dir, results), tmp)
    tmp.replace(path)
    return path


@hookimpl
def pytest_gap_write_outputs(run_dir: Path, results: dict[str, TrialResult]) -> None:
    write_episodes(run_dir, results)
