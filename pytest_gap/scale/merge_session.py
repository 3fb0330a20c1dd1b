"""The pytest side of `gap merge`: a session over the config that collects nothing.

The merged run must read as one session's run of the plan, so its plan is made the way a
session makes it (session_plan.py: the session's mode table, so a conftest's or plugin's modes
count, and its --gap-families/--gap-modes) and its files are written by the session's own
`pytest_gap_write_outputs` writers (every one, a project's own included), over every record in
the merged dir with the plan's trials as the selection, exactly as a session's end does (the
plugin's `Lead.write_outputs`).
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest

from pytest_gap.errors import GapError
from pytest_gap.report import fold_config
from pytest_gap.results import scan_results
from pytest_gap.scale.merge import (
    Merge,
    MergeOutcome,
    MergeRefused,
    input_dirs,
    one_plan,
    read_input,
)
from pytest_gap.session_plan import SessionPlan, session_mode_table, session_selection


def merge(
    paths: list[Path], out: Path, *, config: Path | None = None, allow_partial: bool = False
) -> MergeOutcome:
    """Merge the run dirs `paths` into the new run dir `out` (pytest_gap/scale/merge.py)."""
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MergeRefused(f"--out {out}: exists and is not empty; name a new directory")
    inputs = [read_input(p) for p in input_dirs(paths)]
    if out in {i.path for i in inputs}:
        raise MergeRefused(f"--out {out} is one of the inputs; name a new directory")
    digest, config_path, (families, modes) = one_plan(inputs, config)
    job = _MergeJob(Merge(inputs, out, config_path, digest), allow_partial)
    args = [str(config_path), "--collect-only", "-p", "no:cacheprovider", "-qq"]
    # The outputs are written in this process, whatever the project's addopts say; and its
    # modules are imported already (no assertion rewriting to ask for: under a project's
    # `filterwarnings = error` asking would stop the session).
    args += ["-n", "0", "--assert=plain"]
    for option, values in (("--gap-families", families), ("--gap-modes", modes)):
        if values:
            args += [option, ",".join(values)]
    said = io.StringIO()  # the session's terminal: shown only when it did not run the merge
    with contextlib.redirect_stdout(said):
        code = pytest.main(args, plugins=[job])
    if job.error is not None:
        raise job.error
    if job.outcome is None:
        sys.stderr.write(said.getvalue())
        raise MergeRefused(
            f"{config_path}: a pytest session over it did not start (exit {int(code)}); run "
            f"`pytest {config_path} --collect-only` to see why"
        )
    return job.outcome


class _MergeJob:
    """The plugin object of the merge's session."""

    def __init__(self, merge: Merge, allow_partial: bool):
        self.merge, self.allow_partial = merge, allow_partial
        self.error: GapError | None = None
        self.outcome: MergeOutcome | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> bool:
        """After sessionstart (the manifest writer has noted the start); collects nothing."""
        try:
            self.outcome = self._merge(session.config)
        except GapError as exc:
            self.error = exc if isinstance(exc, MergeRefused) else MergeRefused(str(exc))
        return True

    def _merge(self, config: pytest.Config) -> MergeOutcome:
        merge = self.merge
        table = session_mode_table(config)
        loaded = SessionPlan(merge.config_path, table, **session_selection(config))
        merge.check_digest(loaded.plan_digest)
        planned = [t for cell in loaded.cells for t in cell.trials()]
        selection = merge.select(planned, self.allow_partial)
        notes = merge.write(selection)
        results = scan_results(merge.out)
        benchmark = loaded.config
        summary = fold_config(loaded.all_cells, results, benchmark, {t.id for t in planned})
        config.hook.pytest_gap_write_outputs(
            config=config, run_dir=merge.out, summary=summary, results=results, benchmark=benchmark
        )
        return MergeOutcome(
            out=merge.out,
            inputs=[i.label for i in merge.inputs],
            planned=len(planned),
            merged=len(selection.kept),
            missing=selection.missing,
            duplicates=selection.duplicates,
            not_planned=selection.not_planned,
            shards=selection.shards,
            notes=notes,
            gate_line=summary.gate.line(),
            passed=summary.gate.passed,
        )
