"""The plugin's command-line options: declared here, read once into one frozen `GapOptions`.

Every role reads its options from the `GapOptions` built in `pytest_configure` (as pytest's own
plugins read `config.option` once into their plugin object), not from `config.getoption`
scattered through the session: what a session was asked to do is one value, fixed for the
session. pytest's own options (-n, --tx, --dist, --collect-only) stay pytest's and xdist's.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_gap.config.model import FRAMES_EVERY_HINT, MAX_EPISODE_STEPS
from pytest_gap.errors import GapError
from pytest_gap.outputs import plots
from pytest_gap.scale.shard import ShardSpec, parse_shard
from pytest_gap.session_plan import session_selection


@dataclass(frozen=True)
class GapOptions:
    """What the command line asked of a benchmark session (the `--gap-*` options)."""

    resume: bool  # --gap-resume
    reuse_latest: bool  # --gap-resume or --lf: the session writes into the latest run dir
    output_dir: Path | None  # --gap-output-dir, resolved
    families: list[str] | None  # --gap-families, split on commas
    modes: list[str] | None  # --gap-modes, split on commas
    gate_on: bool  # not --gap-no-gate
    frames_every: int | None  # --gap-frames: overrides trials.frames_every
    baseline: Path | None  # --gap-baseline: overrides gate.baseline, resolved
    shard: ShardSpec | None  # --gap-shard K/N (checked in pytest_cmdline_main)
    report_json: str | None  # --gap-report-json: `gap benchmark` reads the session's end here
    live_progress: bool  # --gap-progress
    debug_run: bool  # --gap-debug-run (GAP_PARALLEL_INPROC=1)
    ray: str | None  # --gap-ray auto|ADDRESS

    @classmethod
    def of(cls, config: pytest.Config) -> GapOptions:
        resume = bool(config.getoption("gap_resume"))
        raw_output = config.getoption("gap_output_dir")
        return cls(
            resume=resume,
            reuse_latest=resume or bool(config.getoption("lf", False)),
            output_dir=Path(raw_output).resolve() if raw_output else None,
            **session_selection(
                config
            ),  # families, modes, frames, baseline: as `gap merge` reads them
            gate_on=not config.getoption("gap_no_gate"),
            shard=shard_option(config),
            report_json=config.getoption("gap_report_json"),
            live_progress=bool(config.getoption("gap_progress")),
            debug_run=bool(config.getoption("gap_debug_run")),
            ray=config.getoption("gap_ray", None),
        )


def shard_option(config: pytest.Config) -> ShardSpec | None:
    raw = config.getoption("gap_shard", None)
    return parse_shard(raw) if raw is not None else None


def check_command_line(config: pytest.Config) -> int | None:
    """A bad --gap-shard, or --gap-ray with -n, is one line and exit 2, before anything
    starts."""
    try:
        shard_option(config)
        if config.getoption("gap_ray") and config.getoption("numprocesses", None):
            raise GapError(
                "--gap-ray runs trials on Ray actors, -n on xdist workers: drop one of them"
            )
    except GapError as exc:
        sys.stderr.write(f"ERROR: {exc}\n")
        return 2
    return None


def frames_every(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_EPISODE_STEPS:  # the config key's bound, the same words
        raise argparse.ArgumentTypeError(f"{raw!r}: {FRAMES_EVERY_HINT}")
    return value


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("gap", "pytest-gap benchmarks")
    group.addoption(
        "--gap-resume",
        action="store_true",
        help="reuse the latest run dir; skip trials that already have a valid result.json",
    )
    group.addoption(
        "--gap-no-gate",
        action="store_true",
        help="do not let the gate decide the exit status (pytest's usual status instead)",
    )
    group.addoption("--gap-output-dir", help="write run dirs here instead of the config's")
    group.addoption(
        "--gap-families", action="append", help="restrict grid configs to these families (csv)"
    )
    group.addoption("--gap-modes", action="append", help="restrict grid configs to these modes")
    group.addoption("--gap-report-json", help="write each config's run dir and gate here")
    group.addoption(
        "--gap-shard",
        metavar="K/N",
        help="run only shard K of N: disjoint parts of the planned trials, balanced by expected "
        "cost, the same on every machine (merge the shards' run dirs with `gap merge`)",
    )
    group.addoption(
        "--gap-frames",
        type=frames_every,
        metavar="N",
        help="write a WebP strip of every N-th agentview frame of each trial into the run "
        "dir's frames/ (overrides trials.frames_every; 0 turns it off)",
    )
    group.addoption(
        "--gap-baseline",
        metavar="RUN_DIR_OR_PARQUET",
        help="gate each config against this baseline run instead of its threshold: fail where "
        "its trials are worse than the baseline's on the same episodes by more than "
        "gate.margin (overrides gate.baseline; pytest_gap/baseline.py)",
    )
    group.addoption(
        "--gap-progress",
        action="store_true",
        help="print each config's progress (trials done, successes, errored, elapsed, ETA) "
        "as every trial is recorded (`gap benchmark` turns it on)",
    )
    group.addoption(
        "--gap-no-plots",
        action="store_true",
        # read when the session starts: a CI job (or a test suite) that never looks at them
        default=plots.off_in_environment(),
        help="do not draw the run dir's plots/ (PNG heatmap and per-family bars); "
        "GAP_NO_PLOTS=1 in the environment does the same",
    )
    group.addoption(
        "--gap-ray",
        metavar="auto|ADDRESS",
        help="run each trial on a Ray cluster (`auto`: the one `ray start` runs on this machine, "
        "or its address host:port / ray://...); the run dir is written here; not with -n",
    )
    group.addoption(
        "--gap-debug-run",
        action="store_true",
        help="mark the run as an in-process debug run, not for scoring (`gap benchmark` with "
        "GAP_PARALLEL_INPROC=1 sets it)",
    )
    parser.addini(
        "gap_benchmark_dirs",
        type="args",
        default=["benchmarks"],
        help="directories (relative to rootdir) whose YAML files are benchmark configs",
    )
