"""Fold trial results into cell rows, pivots, the gate, and the run dir's summary files.

Pure functions over TrialResults, plus `write_run_outputs`, which rebuilds every summary file of
a run dir from every result.json in it: a resumed or `--lf` session never loses what an earlier
session scored.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from pathlib import Path

from pydantic import BaseModel

from pytest_gap.plan import Cell
from pytest_gap.redaction import redact_argv, redact_tree
from pytest_gap.results import TrialResult, now_iso, write_json

DONE_FLAG = "aaa_done_flag.txt"
SUMMARY_TSV = "summary.tsv"
SUMMARY_JSON = "summary.json"
CELL_RESULT = "cell_result.json"
TSV_COLUMNS = (
    "mode",
    "policy_id",
    "family",
    "variation",
    "suite_name",
    "success_rate",
    "completion_rate",
    "avg_reward",
    "n_success",
    "n_trials",
    "n_infra",
    "wall_clock_s",
    "error",
)


class TaskRow(BaseModel):
    task_id: int
    success_rate: float | None
    completion_rate: float | None
    avg_reward: float | None
    n_trials: int
    n_success: int


class CellSummary(BaseModel):
    mode: str
    policy_id: str | None
    privileged: bool = False  # an oracle reading ground truth: not comparable with policies
    family: str
    variation: str
    suite_name: str | None
    key: str
    row: str
    column: str
    success_rate: float | None  # None when no trial of the cell was scored
    completion_rate: float | None
    avg_reward: float | None
    n_success: int
    n_trials: int  # scored trials; errored ones are not counted
    n_infra: int
    n_errored: int
    n_planned: int
    wall_clock_s: float
    produce_s: float
    eval_s: float
    error: str | None
    tasks: list[TaskRow]


class Gate(BaseModel):
    passed: bool
    success_rate: float
    completion_rate: float
    threshold: float
    n_trials: int
    n_success: int
    reasons: list[str]

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"gate {verdict}: success_rate={self.success_rate:.3f} "
            f"threshold={self.threshold:.3f}"
            + (f" ({'; '.join(self.reasons)})" if self.reasons else "")
        )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_cell(cell: Cell, results: list[TrialResult]) -> CellSummary:
    scored = [r for r in results if not r.errored]
    errored = [r for r in results if r.errored]
    error = None
    if errored:
        first = errored[0]
        error = f"{len(errored)} of {len(results)} trials errored: {first.error}"
    tasks = []
    for task_id in sorted({r.task_id for r in results}):
        rows = [r for r in scored if r.task_id == task_id]
        tasks.append(
            TaskRow(
                task_id=task_id,
                success_rate=_mean([float(r.success) for r in rows]),
                completion_rate=_mean([r.completion for r in rows]),
                avg_reward=_mean([r.reward for r in rows]),
                n_trials=len(rows),
                n_success=sum(r.success for r in rows),
            )
        )
    return CellSummary(
        mode=cell.mode,
        policy_id=f"{cell.policy_id} [privileged]" if cell.privileged else cell.policy_id,
        privileged=cell.privileged,
        family=cell.family,
        variation=cell.variation,
        suite_name=cell.suite_name,
        key=cell.key,
        row=cell.row,
        column=cell.column,
        success_rate=_mean([float(r.success) for r in scored]),
        completion_rate=_mean([r.completion for r in scored]),
        avg_reward=_mean([r.reward for r in scored]),
        n_success=sum(r.success for r in scored),
        n_trials=len(scored),
        n_infra=sum(r.infra_failure for r in results),
        n_errored=len(errored),
        n_planned=len(cell.task_ids) * len(cell.seeds),
        wall_clock_s=round(sum(r.wall_s for r in results), 2),
        produce_s=round(sum(r.produce_s for r in results), 2),
        eval_s=round(sum(r.eval_s for r in results), 2),
        error=error,
        tasks=tasks,
    )


def evaluate_gate(cells: list[CellSummary], threshold: float) -> Gate:
    n_trials = sum(c.n_trials for c in cells)
    n_success = sum(c.n_success for c in cells)
    rate = n_success / n_trials if n_trials else 0.0
    completion = (
        sum((c.completion_rate or 0.0) * c.n_trials for c in cells) / n_trials if n_trials else 0.0
    )
    reasons = []
    if n_trials == 0:
        reasons.append("no trial was scored")
    errored = [c.column if c.suite_name else f"{c.row} {c.column}" for c in cells if c.error]
    if errored:
        reasons.append(f"errored cells: {', '.join(errored)}")
    if n_trials and rate < threshold:
        reasons.append(f"success rate below threshold ({n_success}/{n_trials})")
    return Gate(
        passed=not reasons,
        success_rate=rate,
        completion_rate=completion,
        threshold=threshold,
        n_trials=n_trials,
        n_success=n_success,
        reasons=reasons,
    )


def pivot(cells: list[CellSummary], metric: str) -> tuple[list[str], list[str], dict]:
    """Rows mode[@policy_id], columns family/variation (or suite): rate, 'ERR' or '-'."""
    rows = list(dict.fromkeys(c.row for c in cells))
    columns = list(dict.fromkeys(c.column for c in cells))
    matrix: dict[str, dict[str, float | str]] = {r: dict.fromkeys(columns, "-") for r in rows}
    for c in cells:
        value = getattr(c, metric)
        matrix[c.row][c.column] = "ERR" if c.error or value is None else round(value, 4)
    return rows, columns, matrix


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def format_tsv(cells: list[CellSummary]) -> str:
    lines = ["\t".join(TSV_COLUMNS)]
    for c in cells:
        values = c.model_dump()
        values["wall_clock_s"] = f"{c.wall_clock_s:.1f}"
        lines.append("\t".join(_fmt(values[k]).replace("\t", " ") for k in TSV_COLUMNS))
    for metric in ("success_rate", "completion_rate"):
        rows, columns, matrix = pivot(cells, metric)
        lines += ["", "\t".join([f"{metric}_pivot", *columns])]
        lines += ["\t".join([r, *(_fmt(matrix[r][col]) for col in columns)]) for r in rows]
    return "\n".join(lines) + "\n"


def console_table(cells: list[CellSummary]) -> str:
    from tabulate import tabulate

    rows, columns, matrix = pivot(cells, "success_rate")
    table = [[r, *(_fmt(matrix[r][col]) for col in columns)] for r in rows]
    return tabulate(
        table, headers=["success_rate", *columns], tablefmt="simple", disable_numparse=True
    )


def collate_videos(run_dir: Path, results: list[TrialResult]) -> int:
    """Hard-link every trial video into run_dir/videos/ under a flat descriptive name."""
    videos = run_dir / "videos"
    count = 0
    for r in results:
        if not r.video or not (run_dir / r.video).is_file():
            continue
        head = [r.mode, r.policy_id] if r.suite_name is None else ["suites", r.suite_name]
        parts = [*head, r.family, r.variation, f"task{r.task_id:02d}", f"seed{r.seed:03d}"]
        verdict = "pass" if r.success else "fail"
        name = "__".join(p for p in parts if p) + f"__{verdict}.mp4"
        dest = videos / name
        videos.mkdir(exist_ok=True)
        for stale in videos.glob(name.rsplit("__", 1)[0] + "__*.mp4"):
            stale.unlink()
        try:
            os.link(run_dir / r.video, dest)
        except OSError:  # another filesystem, or links unsupported
            shutil.copy2(run_dir / r.video, dest)
        count += 1
    return count


def write_run_outputs(
    run_dir: Path,
    cells: list[Cell],
    results: dict[str, TrialResult],
    *,
    threshold: float,
    grid: dict,
) -> tuple[list[CellSummary], Gate]:
    """Rebuild summary.tsv/json, cell_result.json files, flags and videos/ from `results`."""
    summaries, by_mode = [], defaultdict(lambda: [0, 0])
    for cell in cells:
        trials = cell.trials()
        found = [results[t.key] for t in trials if t.key in results]
        top = cell.key.split("/", 1)[0]  # the mode, or "suites"
        by_mode[top][0] += len(trials)
        by_mode[top][1] += len(found)
        if not found:
            continue
        summary = summarize_cell(cell, found)
        summaries.append(summary)
        write_json(run_dir / cell.key / CELL_RESULT, summary.model_dump(mode="json"))
    gate = evaluate_gate(summaries, threshold)
    matrix = {m: pivot(summaries, m)[2] for m in ("success_rate", "completion_rate")}
    write_json(
        run_dir / SUMMARY_JSON,
        {
            "grid": redact_tree(grid),  # a policy url's password, a token in a command
            "cells": [s.model_dump(mode="json") for s in summaries],
            "matrix": matrix,
            "gate": gate.model_dump(mode="json"),
            "n_trials": gate.n_trials,
            "n_success": gate.n_success,
            "success_rate": gate.success_rate,
            "completion_rate": gate.completion_rate,
            "updated_at": now_iso(),
        },
    )
    (run_dir / SUMMARY_TSV).write_text(format_tsv(summaries))
    collate_videos(run_dir, list(results.values()))
    planned = sum(p for p, _ in by_mode.values())
    recorded = sum(r for _, r in by_mode.values())
    _flag(run_dir / DONE_FLAG, planned, recorded)
    for top, (p, r) in by_mode.items():
        _flag(run_dir / top / DONE_FLAG, p, r)
    return summaries, gate


def _flag(path: Path, planned: int, recorded: int) -> None:
    """A sentinel that exists only while every planned trial has a record."""
    if recorded == planned and planned:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"done {now_iso()}: {recorded} of {planned} trials recorded\n")
    else:
        path.unlink(missing_ok=True)


def write_manifest(run_dir: Path, config_path: Path, session: dict) -> None:
    """Append this session to run_manifest.json: who ran what, where, with which options.

    The command line is recorded with secret values masked (`--api-key ***`, `TOKEN=***`,
    `Authorization: Bearer ***`, `ws://user:***@host`): a run dir is shared, keys are not.
    """
    import json
    import socket
    import sys

    from pytest_gap import __version__

    path = run_dir / "run_manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        manifest = {"config": str(config_path), "created_at": now_iso(), "sessions": []}
    manifest["pytest_gap_version"] = __version__
    manifest["sessions"].append(
        redact_tree(
            {
                "finished_at": now_iso(),
                "host": socket.gethostname(),
                "argv": redact_argv(sys.argv[1:]),
                **session,
            }
        )
    )
    write_json(path, manifest)
