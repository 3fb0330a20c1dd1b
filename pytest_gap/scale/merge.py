"""`gap merge RUN_DIR... --out DIR`: shards' run dirs (or any run dirs of one plan) as one run.

What a merge does, in order; it writes nothing until every check has passed:
1. reads every input's records (result.json; a corrupt one is kept as such) and manifest;
2. refuses inputs of different plans: every record and manifest must carry one plan digest
   (provenance.plan_digest), and the shard sessions the same --gap-families/--gap-modes;
3. plans the config as a session would (merge_session.py: a pytest session over the YAML,
   collecting nothing, so its conftests' modes count), and checks its digest is the inputs';
4. picks one record per trial seen in several inputs (`choose`: a scored record over an
   errored one (infrastructure failure, harness error) over a corrupt one; among equals the
   later finished_at; then the earlier input) and reports every such duplicate;
5. checks coverage: a planned trial with no usable record in any input refuses the merge,
   naming the missing trials and shards, unless `allow_partial`: then the merged run is
   written and its gate fails on the missing trials, as a session's that stopped early does;
6. copies each kept trial's dir (result.json, trace/, video.mp4) and what its record points to
   outside it (the task's workflow/, its frame strip) into DIR, seeds run_manifest.json with
   the inputs' sessions, shards and duplicates, and rebuilds summary.tsv/json, cell results,
   episodes.parquet, videos/, plots/, the manifest, the done flags and the gate through the
   same `pytest_gap_write_outputs` writers a session calls, over the same plan: a merge of a
   plan's shards reads as one unsharded run of that plan.
"""

from __future__ import annotations

import filecmp
import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pytest_gap.cells import Trial
from pytest_gap.errors import GapError
from pytest_gap.layout import MANIFEST, PRODUCED_FILE, RESULT_FILE, is_stamp
from pytest_gap.producers.base import PRODUCTION_DIRS, PRODUCTION_FIELDS
from pytest_gap.results import Corrupt, TrialResult, now_iso, read_result, write_json

SHOWN = 3  # missing trials / duplicates a one-line message names before "(+N more)"


class MergeRefused(GapError):
    """The inputs cannot be merged as asked: one line saying why and what to do."""


class MergeInput(BaseModel):
    """One input run dir: its records by trial dir (relative to it) and its manifest."""

    path: Path
    records: dict[str, TrialResult | Corrupt]
    manifest: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        shard = self.shard
        return f"{self.path} (shard {shard})" if shard else str(self.path)

    @property
    def shard(self) -> str | None:
        found = (self.manifest or {}).get("shard")
        return found.get("spec") if isinstance(found, dict) else None

    def digests(self) -> set[str]:
        found = {r.plan_digest for r in self.records.values() if isinstance(r, TrialResult)}
        found.add((self.manifest or {}).get("plan_digest"))
        return {d for d in found if d and d != "unknown"}

    def restriction(self) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
        """The --gap-families / --gap-modes of its latest session (None: not restricted)."""
        sessions = (self.manifest or {}).get("sessions") or [{}]
        last = sessions[-1]
        return tuple(last.get("families") or ()) or None, tuple(last.get("modes") or ()) or None

    def config_path(self) -> str | None:
        if self.manifest and self.manifest.get("config"):
            return str(self.manifest["config"])
        configs = [r.config for r in self.records.values() if isinstance(r, TrialResult)]
        return configs[0] if configs else None


class Duplicate(BaseModel):
    """A trial recorded in more than one input, and which record the merge kept."""

    trial: str  # trial dir, relative to the run dir
    kept: str  # the input whose record was kept
    dropped: list[str]
    rule: str  # why that one: "scored over errored", "later finished_at", ...


class MergeOutcome(BaseModel):
    out: Path
    inputs: list[str]
    planned: int
    merged: int  # planned trials with a record in DIR
    missing: list[str]  # planned trial ids with none (only with allow_partial)
    duplicates: list[Duplicate]
    not_planned: int  # records in the inputs of trials this plan does not have (left out)
    shards: list[str]  # the shard specs the inputs say they are
    notes: list[str]
    gate_line: str
    passed: bool


# -- reading the inputs ---------------------------------------------------------------------------
def input_dirs(paths: list[Path]) -> list[Path]:
    """Each path as a run dir, or an output dir as its timestamped run dirs (a shard resumed in
    a new run dir gives two), in the order given."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw).resolve()
        if not path.is_dir():
            raise MergeRefused(f"{raw}: no such run dir; give the shards' run dirs")
        stamped = [p for p in path.iterdir() if p.is_dir() and is_stamp(p.name)]
        if (path / MANIFEST).is_file() or not stamped:
            if not any(path.rglob(RESULT_FILE)) and not (path / MANIFEST).is_file():
                raise MergeRefused(f"{raw}: not a run dir (no result.json, no {MANIFEST} in it)")
            stamped = []
        found += sorted(stamped) or [path]
    unique = list(dict.fromkeys(found))
    if len(unique) < len(found):
        raise MergeRefused("the same run dir is given twice; give each input once")
    return unique


def read_input(path: Path) -> MergeInput:
    records: dict[str, TrialResult | Corrupt] = {}
    for result in sorted(path.rglob(RESULT_FILE)):
        found = read_result(result.parent)
        if found is not None:
            records[result.parent.relative_to(path).as_posix()] = found
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        manifest = None
    return MergeInput(path=path, records=records, manifest=manifest)


def _rank(record: TrialResult | Corrupt) -> int:
    """What a record is worth: scored 2, errored (infrastructure or harness) 1, corrupt 0."""
    if isinstance(record, Corrupt):
        return 0
    return 1 if record.errored else 2


def _finished(record: TrialResult | Corrupt) -> float:
    text = getattr(record, "finished_at", None)
    try:
        return datetime.fromisoformat(text).timestamp() if text else float("-inf")
    except ValueError:
        return float("-inf")


def choose(candidates: list[tuple[int, TrialResult | Corrupt]]) -> tuple[int, str]:
    """The input index whose record of one trial the merge keeps, and the rule that decided:
    a scored record over an errored one over a corrupt one; among equals the later
    finished_at; among those the earlier input."""
    best = max(candidates, key=lambda c: (_rank(c[1]), _finished(c[1]), -c[0]))
    rest = [c for c in candidates if c is not best]
    if any(_rank(c[1]) < _rank(best[1]) for c in rest):
        worse = {0: "corrupt", 1: "errored"}
        dropped = sorted({worse[_rank(c[1])] for c in rest if _rank(c[1]) < _rank(best[1])})
        kept = "scored" if _rank(best[1]) == 2 else "errored"
        return best[0], f"{kept} over {' and '.join(dropped)}"
    if any(_finished(c[1]) < _finished(best[1]) for c in rest):
        return best[0], "later finished_at"
    return best[0], "identical rank and finish time: the earlier input"


def one_plan(inputs: list[MergeInput], config: Path | None) -> tuple[str, Path, tuple]:
    """The inputs' one plan digest, the config to plan with, and the sessions' restriction."""
    digests = {d: i for i in inputs for d in i.digests()}
    if len(digests) > 1:
        (a, ia), (b, ib) = list(digests.items())[:2]
        raise MergeRefused(
            f"the inputs come from different plans: {ia.label} has plan digest {a[:12]}, "
            f"{ib.label} has {b[:12]}; merge only run dirs of one config run with the same plan"
        )
    restrictions = {i.restriction(): i for i in inputs if i.manifest}
    if len(restrictions) > 1:
        (ra, ia), (rb, ib) = list(restrictions.items())[:2]
        raise MergeRefused(
            f"the inputs ran different selections: {ia.label} with families/modes {ra}, "
            f"{ib.label} with {rb}; merge shards run with the same --gap-families/--gap-modes"
        )
    families, modes = next(iter(restrictions), (None, None))
    if config is None:
        named = next((c for c in (i.config_path() for i in inputs) if c), None)
        if named is None:
            raise MergeRefused("no input names its config; give it with --config BENCHMARK.yaml")
        config = Path(named)
    if not config.is_file():
        raise MergeRefused(
            f"{config}: the config the inputs ran is not here; give it with --config "
            "BENCHMARK.yaml (the same YAML, at its path on this machine)"
        )
    digest = next(iter(digests), "")
    return digest, config.resolve(), (families, modes)


# -- choosing and writing ------------------------------------------------------------------------
class Selection(BaseModel):
    """What the merge takes: per planned trial with a usable record, the input to take it from."""

    kept: dict[str, int]  # trial dir -> input index, in trial dir order
    duplicates: list[Duplicate]
    missing: list[str]  # planned trial ids without a usable record, in plan order
    not_planned: int
    shards: list[str]


class Merge:
    """Inputs of one plan going into the new run dir `out`: picks the records, copies them and
    seeds the manifest. Planning (which needs the session's mode table) happens outside."""

    def __init__(self, inputs: list[MergeInput], out: Path, config_path: Path, digest: str):
        self.inputs, self.out, self.config_path, self.digest = inputs, out, config_path, digest
        self._origin: dict[str, Path] = {}  # a copied path outside a trial dir: its input

    def check_digest(self, planned_digest: str) -> None:
        if self.digest and planned_digest != self.digest:
            raise MergeRefused(
                f"{self.config_path} plans digest {planned_digest[:12]} but the inputs ran "
                f"{self.digest[:12]}: the config changed since; give the YAML they ran with "
                "--config"
            )

    def select(self, planned: list[Trial], allow_partial: bool) -> Selection:
        """Pick the records; refuse (before anything is written) when a planned trial has none
        and `allow_partial` is not set."""
        kept, duplicates, not_planned = self._choose({t.key for t in planned})
        missing = [t.id for t in planned if t.key not in kept]
        shards = sorted({i.shard for i in self.inputs if i.shard}, key=_shard_order)
        if missing and not allow_partial:
            raise MergeRefused(_missing_line(missing, len(planned), shards))
        return Selection(
            kept=kept,
            duplicates=duplicates,
            missing=missing,
            not_planned=not_planned,
            shards=shards,
        )

    def write(self, selection: Selection) -> list[str]:
        """Copy the kept trials into `out` and seed its manifest; notes on what differed."""
        self.out.mkdir(parents=True, exist_ok=True)
        notes = [self._copy(key, self.inputs[index]) for key, index in selection.kept.items()]
        self._seed_manifest(selection.kept, selection.duplicates, selection.shards)
        return sorted({n for group in notes for n in group})

    def _choose(self, planned: set[str]) -> tuple[dict[str, int], list[Duplicate], int]:
        """Per planned trial with a usable record: the input to take it from."""
        seen: dict[str, list[tuple[int, TrialResult | Corrupt]]] = {}
        for index, found in enumerate(self.inputs):
            for key, record in found.records.items():
                seen.setdefault(key, []).append((index, record))
        kept, duplicates = {}, []
        for key in sorted(seen):
            if key not in planned:
                continue
            index, rule = choose(seen[key])
            if _rank(dict(seen[key])[index]) == 0:
                continue  # only corrupt records: the trial is missing
            kept[key] = index
            if len(seen[key]) > 1:
                duplicates.append(
                    Duplicate(
                        trial=key,
                        kept=str(self.inputs[index].path),
                        dropped=[str(self.inputs[i].path) for i, _ in seen[key] if i != index],
                        rule=rule,
                    )
                )
        return kept, duplicates, len(set(seen) - planned)

    def _copy(self, key: str, source: MergeInput) -> list[str]:
        """The trial's dir, then what its record points to outside it, into the merged run."""
        shutil.copytree(source.path / key, self.out / key)
        record = source.records[key]
        notes = []
        for linked in (record.workflow, record.frames, record.video, record.trace):
            if not linked or Path(linked).is_relative_to(key):
                continue
            src, dest = source.path / linked, self.out / linked
            if not src.exists():
                continue
            if dest.exists():
                if not _same(src, dest):
                    notes.append(
                        f"{linked} differs between the inputs (the shards produced it "
                        f"separately); kept the first copy, from {self._origin[linked]}"
                    )
                continue
            self._origin[linked] = source.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dest)
            else:
                shutil.copy2(src, dest)
        return notes

    def _seed_manifest(self, kept: dict[str, int], duplicates: list[Duplicate], shards) -> None:
        """run_manifest.json before the writers update it: every input's sessions (so the
        merged run keeps how each part was run) and what the merge took from where."""
        sessions = []
        for found in self.inputs:
            for entry in (found.manifest or {}).get("sessions", []):
                sessions.append({**entry, "input": str(found.path)})
        inputs = []
        for index, found in enumerate(self.inputs):
            inputs.append(
                {
                    "run_dir": str(found.path),
                    "shard": found.shard,
                    "records": len(found.records),
                    "kept": sum(1 for i in kept.values() if i == index),
                }
            )
        write_json(
            self.out / MANIFEST,
            {
                "config": str(self.config_path),
                "created_at": now_iso(),
                "merged_from": {
                    "inputs": inputs,
                    "shards": shards,
                    "duplicates": [d.model_dump() for d in duplicates],
                    "rule": "a scored record over an errored one over a corrupt one; among "
                    "equals the later finished_at; then the earlier input",
                },
                "sessions": sessions,
            },
        )


def _same(a: Path, b: Path) -> bool:
    """Whether two inputs' copies of a file or dir hold the same thing. A produced workflow is
    compared without what describes its production alone (producers.base: produced.json's
    time, LLM calls and cache hit, the agents' transcripts), which differs between any two
    productions of the same workflow."""
    if a.is_file() and b.is_file():
        if a.name == PRODUCED_FILE:
            return _produced(a) == _produced(b)
        return filecmp.cmp(a, b, shallow=False)
    if a.is_dir() and b.is_dir():
        left, right = _compared_files(a), _compared_files(b)
        return left == right and all(_same(a / p, b / p) for p in left)
    return False


def _compared_files(directory: Path) -> list[Path]:
    skipped = PRODUCTION_DIRS if (directory / PRODUCED_FILE).is_file() else ()
    found = (p.relative_to(directory) for p in directory.rglob("*") if p.is_file())
    return sorted(p for p in found if p.parts[0] not in skipped)


def _produced(path: Path) -> Any:
    """produced.json's fields but those of the production alone (its bytes if not JSON)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return path.read_bytes()
    if isinstance(meta, dict):
        for field in PRODUCTION_FIELDS:
            meta.pop(field, None)
    return meta


def _shard_order(spec: str) -> tuple[int, int]:
    k, _, n = spec.partition("/")
    return (int(n), int(k)) if k.isdigit() and n.isdigit() else (0, 0)


def _missing_line(missing: list[str], planned: int, shards: list[str]) -> str:
    shown = ", ".join(missing[:SHOWN]) + (
        f", ... (+{len(missing) - SHOWN} more)" if len(missing) > SHOWN else ""
    )
    where = ""
    counts = {int(s.partition("/")[2]) for s in shards}
    if len(counts) == 1:
        n = counts.pop()
        absent = [f"{k}/{n}" for k in range(1, n + 1) if f"{k}/{n}" not in shards]
        if absent:
            where = f"; shard{'s' if len(absent) > 1 else ''} {', '.join(absent)} not given"
    return (
        f"{len(missing)} of {planned} planned trials have no record in the inputs (missing: "
        f"{shown}){where}; rerun or add the missing shards, or pass --allow-partial to write a "
        "merged run whose gate fails on them"
    )
