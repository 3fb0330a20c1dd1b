"""What a trial's records say: the fields TrialRun (trial.py) records, and the records written
for a trial by someone else. TrialRun decides what happens in a trial; this module spells out
what of it is recorded.

- `opening_fields(...)`: what a record knows before its trial runs (identity, worker, devices,
  start, earlier attempts, provenance).
- `start_state(episode)`: the state a record says its episode started from (a finished trial's
  record and an aborted one's alike).
- `exception_fields(exc, ...)`: the record of an attempt an exception ended (faults.py decides
  whether it was a harness fault).
- `no_workflow_fields(workflow_dir)`: the record of a producer that wrote no valid graph.
- `relative_path`, `frames_link`, `frames_receipt`: the paths a record names.
- `workflow_reason(run)`: the one-line reason of a workflow run that did not succeed.
- `workflow_run_fields(run, ...)`: the record of a workflow run that ended.
- `episode_loop_fields(outcome, ...)`: the record of a backend's own episode loop (vla-eval).
- `evidence_fields(log, ...)`: either's per-step evidence (steps.parquet) and failure label.
- `write_warmup(...)`: the run dir's record of a policy server's warm-up, charged to no trial.
- `record_crash(...)`: the controller's record of a trial whose worker died and wrote nothing.

Knows nothing of pytest.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gap.cells import Trial
from pytest_gap.errors import GapError, VideoError
from pytest_gap.faults import harness_fault
from pytest_gap.layout import (
    ERROR_FILE,
    PRODUCED_FILE,
    RUNNING_FILE,
    STEPS_FILE,
    WARMUP_DIR,
    inside,
)
from pytest_gap.policies.wire import metadata_digest
from pytest_gap.provenance import record_fields
from pytest_gap.redaction import redact_text
from pytest_gap.results import (
    EXIT_CRASH,
    EXIT_ERROR,
    EXIT_TIMEOUT,
    EarlierAttempt,
    TrialIdentity,
    TrialResult,
    now_iso,
    read_result,
    write_json,
    write_result,
)
from pytest_gap.sim.failure_labels import failure_label
from pytest_gap.workflow.executor import STEP_LIMIT, RunResult

if TYPE_CHECKING:
    from pytest_gap.sim.backend import EpisodeOutcome, WarmUp
    from pytest_gap.sim.step_log import StepLog


def opening_fields(
    identity: TrialIdentity,
    backend: str,
    *,
    worker: str | None,
    earlier_attempts: list[EarlierAttempt],
    plan_digest: str | None,
    policy_url: str | None,
) -> dict:
    """The fields of a trial's record known before it runs: its identity, the worker and the
    devices it runs on, when it started, its earlier attempts, its provenance."""
    base = {
        **identity.model_dump(),
        "worker": worker,
        "devices": {
            k: os.environ[k]
            for k in ("CUDA_VISIBLE_DEVICES", "MUJOCO_EGL_DEVICE_ID")
            if k in os.environ
        },
        "started_at": now_iso(),
        "earlier_attempts": earlier_attempts,
    }
    return base | record_fields(backend, plan_digest=plan_digest, policy_url=policy_url)


def start_state(episode) -> dict:
    """What a record says of the state its episode started from."""
    return {
        "init_state": episode.init_state,
        "init_state_digest": getattr(episode, "init_state_digest", None),
        "scene_digest": getattr(episode, "scene_digest", None),
    }


def exception_fields(exc: Exception, trial_dir: Path, key: str) -> dict:
    """The record of an attempt an exception ended outside the workflow's nodes (env build,
    reset, production, scoring). A harness fault (faults.py) or a bug of the harness is an
    infrastructure failure, its traceback in the trial dir's error.txt (a fault's in the
    record too: a re-run's fresh trial dir has no error.txt of the attempt before it); a
    GapError that is no fault is something the user can fix, said in one line."""
    fault = harness_fault(exc)
    if fault is None and isinstance(exc, GapError):
        return {"exit_code": EXIT_ERROR, "error": str(exc)}
    (trial_dir / ERROR_FILE).write_text("".join(traceback.format_exception(exc)))
    where = "traceback in this record's fault" if fault else f"traceback in {key}/{ERROR_FILE}"
    return {
        "exit_code": EXIT_ERROR,
        "error": f"{type(exc).__name__}: {exc} ({where})",
        "infra_failure": True,
        "fault": fault,
    }


def no_workflow_fields(workflow_dir: Path) -> dict:
    """What a record says of a producer that wrote no valid graph: the problems it found."""
    produced = json.loads((workflow_dir / PRODUCED_FILE).read_text())
    return {
        "exit_status": "no_workflow",
        "reason": "the LLM produced no valid workflow: "
        + "; ".join(produced.get("problems", [])[:3]),
    }


def relative_path(path: Path, run_dir: Path) -> str:
    """A path result.json records: relative to the run dir, or absolute outside it."""
    path, run_dir = Path(path).absolute(), run_dir.absolute()
    return path.relative_to(run_dir).as_posix() if path.is_relative_to(run_dir) else str(path)


def frames_link(frames_path: Path, run_dir: Path) -> str | None:
    """The trial's frame strip as result.json records it, None if there is none."""
    if frames_path.is_file() and frames_path.stat().st_size:
        return relative_path(frames_path, run_dir)
    return None


def frames_receipt(frames_path: Path, run_dir: Path, every: int | None) -> str | None:
    """`frames_link`, and for a trial that was asked for frames (`every`), proof that it has
    them: a strip that is missing or empty errors the trial (VideoError)."""
    link = frames_link(frames_path, run_dir)
    if every and link is None:
        raise VideoError(
            f"frames: this trial was asked for a frame strip (frames_every {every}, from "
            "trials.frames_every or --gap-frames) but none was written to "
            f"{relative_path(frames_path, run_dir)}"
        )
    return link


def workflow_reason(run: RunResult) -> str | None:
    if run.success:
        return None
    if run.error:
        return f"workflow {run.exit_status}: {run.error}"
    where = f" at {run.end_node}" if run.end_node else ""
    return f"workflow ended with {run.exit_status}{where}"


def workflow_run_fields(
    run: RunResult, policy_id: str | None, log: StepLog, trial_dir: Path, run_dir: Path
) -> dict:
    """The record's fields of a workflow that ran to its end (success or not), its per-step
    evidence among them (`evidence_fields`)."""
    ran_out = run.exit_status == STEP_LIMIT
    return {
        "policy_digest": run.policy_digests.get(policy_id or ""),
        "success": run.success,
        "completion": run.completion,
        "reward": 1.0 if run.success else 0.0,
        # The steps the episode's budget counted, at most the budget: a bring-up's are its own.
        "steps": run.steps - run.bringup_steps,
        "bringup_steps": run.bringup_steps,
        "exit_status": run.exit_status,
        "reason": workflow_reason(run),
        **evidence_fields(log, trial_dir, run_dir, not run.success, ran_out),
    }


def episode_loop_fields(outcome: EpisodeOutcome, trial_dir: Path, run_dir: Path) -> dict:
    """The record of a trial run by its backend's own episode loop (sim/backend.py
    EpisodeLoopEnv), its per-step evidence among them, but for its frame strip, which the trial
    checks. The loop runs to its budget unless the episode succeeds."""
    served = outcome.server_metadata
    failed = not outcome.success
    return {
        "init_state": outcome.init_state,
        "init_state_digest": outcome.init_state_digest,
        "scene_digest": outcome.scene_digest,
        "policy_digest": metadata_digest(served) if served is not None else None,
        "prompt": outcome.prompt,
        "env_prompt": outcome.prompt,
        "success": outcome.success,
        "completion": outcome.completion,
        "reward": 1.0 if outcome.success else 0.0,
        "steps": outcome.steps,
        # The executor's names: the simulator's goal check passed, or the step limit came.
        "exit_status": "task_success" if outcome.success else "step_limit",
        "reason": outcome.reason,
        "backend_info": outcome.info,
        **evidence_fields(outcome.step_log, trial_dir, run_dir, failed, ran_out=failed),
    }


def evidence_fields(
    log: StepLog | None,
    trial_dir: Path,
    run_dir: Path,
    failed: bool = False,
    ran_out: bool = False,
) -> dict:
    """An episode's per-step evidence (sim/step_log.py) written beside its result.json, when
    a step ran, and the label read from it when the episode `failed` (sim/failure_labels.py;
    `ran_out`: of steps): the record's `steps_file` and `failure_label`."""
    if log is None or not len(log):
        return {}
    fields = {"steps_file": relative_path(log.write(trial_dir / STEPS_FILE), run_dir)}
    if failed:
        fields["failure_label"] = failure_label(log.columns(), log.targets, truncated=ran_out)
    return fields


def write_warmup(
    run_dir: Path,
    policy_id: str | None,
    done: WarmUp,
    *,
    timeout_s: float,
    worker: str | None,
    before_trial: str,
) -> None:
    """The record of `policy_id`'s server warm-up in this process: one file per server and
    process in the run dir's warmup/, since no trial's record carries its time."""
    write_json(
        inside(run_dir, f"{WARMUP_DIR}/{policy_id}.{os.getpid()}.json"),
        {
            "policy_id": policy_id,
            "url": redact_text(done.url),  # a password or a signed query stays out
            "seconds": round(done.seconds, 3),
            "inference_s": round(done.inference_s, 3),
            "timeout_s": timeout_s,
            "pid": os.getpid(),
            "worker": worker,
            "before_trial": before_trial,
            **done.info,
        },
    )


def record_crash(
    trial: Trial,
    run_dir: Path,
    *,
    nodeid: str,
    config: str,
    detail: str,
    plan_digest: str | None = None,
    policy_url: str | None = None,
):
    """The controller's record of a trial whose worker died (the worker wrote nothing).

    A trial that had run past its watchdog limit was killed by the watchdog (124); any other
    death (segfault, OOM kill) is a crash (137), an infrastructure failure. Its provenance is
    what the controller knows (no init state digest, no policy digest: the worker had them).
    """
    trial_dir = inside(run_dir, trial.key)
    existing = read_result(trial_dir)
    if isinstance(existing, TrialResult):
        return existing  # it finished; the worker died afterwards
    elapsed, timeout = 0.0, trial.cell.timeout_s
    try:
        running = json.loads((trial_dir / RUNNING_FILE).read_text())
        elapsed = time.time() - running["started"]
    except (OSError, ValueError, KeyError):
        pass
    base = {
        **TrialIdentity.of(trial, nodeid=nodeid, config=config).model_dump(),
        **record_fields(trial.cell.backend, plan_digest=plan_digest, policy_url=policy_url),
        "wall_s": elapsed,
        "finished_at": now_iso(),
    }
    if timeout and elapsed >= timeout:
        result = TrialResult(
            **base,
            exit_code=EXIT_TIMEOUT,
            reason=f"the watchdog killed its worker after {elapsed:.0f} s (limit {timeout:g} s)",
        )
    else:
        result = TrialResult(
            **base,
            exit_code=EXIT_CRASH,
            error=f"its worker process died after {elapsed:.0f} s: {detail}",
            infra_failure=True,
        )
    write_result(trial_dir, result)
    return result
