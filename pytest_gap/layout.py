"""The run directory: every name in it, and the rule that nothing is written outside it.

    <output_dir>/<YYYYMMDD_HHMMSS>/                 a run dir (its stamp: STAMP_FORMAT)
      summary.json  summary.tsv  episodes.parquet  run_manifest.json  aaa_done_flag.txt
      videos/  frames/  plots/  warmup/  policy_logs/  smoke/ (a service run's fake episodes)
      <cell key>/cell_result.json
      <cell key>/task_03/workflow/                 what a trial runs (run/produce.py)
      <cell key>/task_03/seed_007/result.json      one trial (its key: ids.py)
      <cell key>/task_03/seed_007/steps.parquet    every control step's evidence
      <cell key>/task_03/seed_007/trace/dag_trace.json   every node's inputs, outputs, timing
      <cell key>/task_03/seed_007/dataset_*.mp4    both cameras, every step (trials.dataset)
      dataset/                                     the episodes as a LeRobot v3 dataset

The keys of cells and trials are ids.py's; every other name of a run dir is here, and so is
`inside`, checked before the harness deletes or writes a path it made from names.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from pytest_gap.errors import GapError, one_line

SUMMARY_JSON = "summary.json"  # every cell, the matrix, the gate, the config's echo
SUMMARY_TSV = "summary.tsv"  # one row per cell, the spec's columns first, then the pivots
EPISODES = "episodes.parquet"  # one row per recorded trial (docs: reference/parquet)
MANIFEST = "run_manifest.json"  # the session: command, config, hosts, provenance, servers
# Written only while every planned trial has a record (outputs/done.py), and removed when one
# has none; sorts first: a reader sees at a glance that the run is complete.
DONE_FLAG = "aaa_done_flag.txt"
CELL_RESULT = "cell_result.json"  # a cell's summary (as its entry in summary.json)
RESULT_FILE = "result.json"  # one trial's record, written last and atomically
RUNNING_FILE = "running.json"  # a trial in flight (its pid, its start); gone once recorded
# beside result.json: every control step's action, state, gripper, reply (sim/step_log.py)
STEPS_FILE = "steps.parquet"
# beside result.json, with trials.dataset on: each camera's dataset frames, losslessly
DATASET_VIDEO = "dataset_{camera}.mp4"
# beside them: the proprio state each frame shows, the recording's stride and size
DATASET_STATE = "dataset_state.npz"
DATASET_DIR = "dataset"  # <run dir>/dataset/: the run's episodes as a LeRobot v3 dataset
ERROR_FILE = "error.txt"  # beside result.json: the traceback of a trial the harness broke
VIDEOS_DIR = "videos"  # the session's videos, one per recorded trial (recording on)
FRAMES_DIR = "frames"  # <run dir>/frames/<trial slug>.webp: every trial's strip, side by side
PLOTS_DIR = "plots"  # PNG figures of the summary (off: --gap-no-plots, GAP_NO_PLOTS=1)
WARMUP_DIR = "warmup"  # policy servers' warm-up inferences, one file per server and process
POLICY_LOGS_DIR = "policy_logs"  # server logs, servers.json, restarts.log
SMOKE_DIR = "smoke"  # fake-action episodes: recorded here, never folded into a rate
# .slots/<mode or suite>/: the num_workers slots' lock files and the queue of their waiters
SLOTS_DIR = ".slots"
# <workflow dir>/produced.json: who produced the workflow and how (written last: it is done)
PRODUCED_FILE = "produced.json"
STAMP_FORMAT = "%Y%m%d_%H%M%S"
STAMP_RE = re.compile(r"^\d{8}_\d{6}$")


def is_stamp(name: str) -> bool:
    """Whether a directory name is a run dir's stamp."""
    return STAMP_RE.match(name) is not None


def stamp_of(key: str) -> str | None:
    """The stamp a results key starts with (an output dir scanned as if it were a run dir)."""
    first = key.split("/", 1)[0]
    return first if is_stamp(first) else None


def new_stamp() -> str:
    return time.strftime(STAMP_FORMAT)


def latest_run_dir(output_dir: Path) -> Path | None:
    if not output_dir.is_dir():
        return None
    stamped = sorted(p for p in output_dir.iterdir() if p.is_dir() and is_stamp(p.name))
    return stamped[-1] if stamped else None


def resolve_run_dir(output_dir: Path, stamp: str, reuse_latest: bool) -> Path:
    """The run dir of a session: `stamp`, or the latest existing one when resuming.

    Every process of a session computes this independently and gets the same answer: a
    resumed run's latest dir predates the session; otherwise all use the session's stamp.
    """
    if reuse_latest:
        latest = latest_run_dir(output_dir)
        if latest is not None:
            return latest
    return output_dir / stamp


class OutsideRunDir(GapError, ValueError):
    """A path the harness was about to delete or write lies outside its run dir."""


def production_lock(workflow_dir: Path) -> Path:
    """The lock beside a workflow dir that the one process producing it holds (the others wait
    on it, then reuse what it produced)."""
    return workflow_dir.parent / f".produce_{workflow_dir.name}"


def production_scratch(workflow_dir: Path, pid: int) -> Path:
    """Where process `pid` writes a workflow dir before renaming it into place whole."""
    return workflow_dir.with_name(f".{workflow_dir.name}.{pid}.tmp")


def inside(root: Path, relative: str | Path) -> Path:
    """`root / relative`, after checking that it resolves (symlinks and `..` followed) to a path
    strictly inside `root`; OutsideRunDir otherwise. Called before a trial dir is deleted or
    written: a name that got past the pattern cannot reach another run's records."""
    path = root / relative
    base, target = root.resolve(), path.resolve()
    if target == base or not target.is_relative_to(base):
        raise OutsideRunDir(
            f"{one_line(str(relative), 120)} resolves to {one_line(str(target), 120)}, outside "
            f"the run dir {base}; nothing was deleted or written there"
        )
    return path
