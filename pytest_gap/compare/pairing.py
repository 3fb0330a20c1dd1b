"""The two sides of a comparison and their pairs: a run dir read (`load_run`), one of its rows
picked (`select`), and the trials of two rows paired by the episode they ran (`pair`).

A side is one row of a run dir, as the terminal pivot labels it (`mode@policy_id`,
`[privileged]` optional). A trial of A and a trial of B are a pair when they ran the same
episode: the same (backend, family, variation, task, seed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pytest_gap.compare.wording import first_few
from pytest_gap.errors import GapError
from pytest_gap.layout import MANIFEST, SUMMARY_JSON, stamp_of
from pytest_gap.results import TrialResult, scan_results

PRIVILEGED = "[privileged]"


# -- loading ------------------------------------------------------------------------------------
class RunDir(BaseModel):
    """What `gap compare` reads of one run dir: every result.json, the pivot's row labels
    (summary.json), the harness surface (run_manifest.json) and the config echo."""

    path: str
    results: dict[str, TrialResult]
    labels: dict[str, str] = {}  # row without `[privileged]` -> the label the pivot shows
    surface: dict[str, Any] | None = None  # run_manifest.json's harness_surface
    plan: dict[str, Any] | None = None  # summary.json's config echo ("grid")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load_run(path: str | Path) -> RunDir:
    """A run dir read, or a run's episodes.parquet (records only: no row labels, manifest or
    config echo, so the plan and harness checks read the records' digests alone)."""
    run = Path(path)
    if run.is_file() and run.suffix == ".parquet":
        return RunDir(path=str(path), results=_parquet_results(run))
    if not run.is_dir():
        raise GapError(f"{path}: not a directory; give a run dir (<output_dir>/<YYYYMMDD_HHMMSS>)")
    results = scan_results(run)
    if not results:
        raise GapError(
            f"{path}: no trial records (result.json) in it; give a run dir "
            "(<output_dir>/<YYYYMMDD_HHMMSS>) of a session that ran trials"
        )
    stamps = sorted({s for s in map(stamp_of, results) if s})
    if stamps:
        raise GapError(
            f"{path}: an output dir holding run dirs ({first_few(stamps)}); give one run dir, "
            f"e.g. {run / stamps[-1]}"
        )
    summary = _read_json(run / SUMMARY_JSON) or {}
    labels = {
        base_row(c["row"]): c["row"]
        for c in summary.get("cells", [])
        if isinstance(c, dict) and isinstance(c.get("row"), str)
    }
    surface = (_read_json(run / MANIFEST) or {}).get("harness_surface")
    plan = summary.get("grid")
    return RunDir(
        path=str(path),
        results=results,
        labels=labels,
        surface=surface if isinstance(surface, dict) else None,
        plan=plan if isinstance(plan, dict) else None,
    )


def _parquet_results(path: Path) -> dict[str, TrialResult]:
    """The records an episodes.parquet holds (outputs/parquet.py), keyed by trial dir."""
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several kinds for a file that is not Parquet
        raise GapError(f"{path}: not a readable episodes.parquet ({exc})") from None
    results = {}
    for row in rows:
        try:
            results[row["trial_dir"]] = TrialResult(
                nodeid=row["trial_dir"],
                config=str(path),
                mode=row["mode"],
                policy_id=row["policy_id"],
                family=row["family"],
                variation=row["variation"],
                suite=row["suite"],
                task_id=row["task_id"],
                seed=row["seed"],
                init_state=row["init_state"],
                prompt=row["prompt"],
                success=row["success"],
                completion=row["completion"],
                reward=row["reward"],
                steps=row["steps"],
                exit_code=row["exit_code"],
                exit_status=row["exit_status"],
                error="errored (episodes.parquet keeps no reason)" if row["errored"] else None,
                infra_failure=row["is_infra_failure"],
                wall_s=row["wall_s"],
                backend=row["backend"],
                plan_digest=row["plan_digest"],
                init_state_digest=row["init_state_digest"],
                scene_digest=row["scene_digest"],
                policy_url=row["server_url"],
                policy_digest=row["policy_digest"],
                harness_version=row["harness_version"],
                harness_surface=row["harness_surface"],
                packages=json.loads(row["packages"]) if row["packages"] else {},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GapError(
                f"{path}: not an episodes.parquet of pytest-gap (a row lacks {exc}); give the "
                "run dir or the episodes.parquet a session wrote"
            ) from None
    if not results:
        raise GapError(f"{path}: no trial records in it; give a run's episodes.parquet")
    return results


# -- sides and pairs ----------------------------------------------------------------------------
def base_row(label: str) -> str:
    """A row label without its `[privileged]` mark: what a record's mode and policy id say."""
    return label.strip().removesuffix(PRIVILEGED).strip()


def row_of(result: TrialResult) -> str:
    return f"{result.mode}@{result.policy_id}" if result.policy_id else result.mode


class Side(BaseModel):
    run: str
    row: str  # as the pivot labels it
    records: list[TrialResult]


def select(run: RunDir, row: str | None, flag: str) -> Side:
    """The records of one row of `run`; `row` None picks the run's only row."""
    rows = list(dict.fromkeys(row_of(r) for r in run.results.values()))
    shown = ", ".join(run.labels.get(r, r) for r in rows)
    if row is None:
        if len(rows) > 1:
            raise GapError(f"{run.path} has rows {shown}: choose one with {flag} ROW")
        wanted = rows[0]
    else:
        wanted = base_row(row)
        if wanted not in rows:
            raise GapError(f"{flag} {row}: {run.path} has no such row (rows: {shown})")
    records = [r for r in run.results.values() if row_of(r) == wanted]
    return Side(run=run.path, row=run.labels.get(wanted, wanted), records=records)


Key = tuple[str | None, str, str, int, int]


class Pair(BaseModel):
    key: Key
    a: TrialResult
    b: TrialResult

    @property
    def cell(self) -> str:
        return f"{self.key[1]}/{self.key[2]}"

    @property
    def task(self) -> tuple:
        """The bootstrap's cluster: one task of one backend's family/variation."""
        return self.key[:4]

    @property
    def where(self) -> str:
        return f"{self.cell} task {self.key[3]} seed {self.key[4]}"

    @property
    def excluded(self) -> bool:
        return self.a.errored or self.b.errored


class Pairing(BaseModel):
    pairs: list[Pair]
    only_a: int
    only_b: int
    without_backend: bool  # a record did not name its backend: paired without it
    duplicates: list[str]  # a side with two records of one episode


def episode_keys(records: list[TrialResult], with_backend: bool) -> tuple[dict, list[Key]]:
    """Records by the episode they ran (backend None where left out), and the keys seen twice."""
    found: dict[Key, TrialResult] = {}
    twice: list[Key] = []
    for r in records:
        key = (r.backend if with_backend else None, r.family, r.variation, r.task_id, r.seed)
        if key in found:
            twice.append(key)
        found[key] = r
    return found, twice


def pair(a: Side, b: Side) -> Pairing:
    """Pair the two sides' trials by (backend, family, variation, task, seed). The backend is
    left out of the key when a record does not name it (records written before it was kept).
    In the pair list, cells keep the order A recorded them in; tasks and seeds are sorted."""
    with_backend = all(r.backend for r in [*a.records, *b.records])
    ka, twice_a = episode_keys(a.records, with_backend)
    kb, twice_b = episode_keys(b.records, with_backend)
    duplicates = [
        f"{side.row} in {side.run}: {k[1]}/{k[2]} task {k[3]} seed {k[4]}"
        for side, twice in ((a, twice_a), (b, twice_b))
        for k in twice
    ]
    cells = list(dict.fromkeys(k[:3] for k in ka))
    shared = sorted(set(ka) & set(kb), key=lambda k: (cells.index(k[:3]), k[3], k[4]))
    return Pairing(
        pairs=[Pair(key=k, a=ka[k], b=kb[k]) for k in shared],
        only_a=len(set(ka) - set(kb)),
        only_b=len(set(kb) - set(ka)),
        without_backend=not with_backend,
        duplicates=duplicates,
    )
