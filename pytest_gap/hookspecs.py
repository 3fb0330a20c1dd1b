"""The plugin's own hooks: where another plugin (or a conftest.py) joins a benchmark session.

Registered by `pytest_gap.plugin` through `pytest_addhooks`. The output hooks are called on the one
process of a session that writes outputs: the pytest-xdist controller, or the only process of a
session without xdist; never on an xdist worker. Implement them in a plugin (`-p mymod`, a
`pytest11` entry point) or a conftest.py, marked `@pytest.hookimpl(optionalhook=True)` so the
module still loads where pytest-gap is not installed:

    @pytest.hookimpl(optionalhook=True)
    def pytest_gap_write_outputs(run_dir, summary):
        (run_dir / "rate.txt").write_text(f"{summary.gate.success_rate:.3f}\\n")

The harness's own files (summary.tsv, summary.json and cell_result.json, episodes.parquet,
videos/, run_manifest.json, the done flags) are implementations of `pytest_gap_write_outputs` in
`pytest_gap/outputs/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from pytest_gap.config.document import BenchmarkConfig
    from pytest_gap.modes import Mode
    from pytest_gap.producers.base import Producer
    from pytest_gap.report import RunSummary
    from pytest_gap.results import TrialResult


@pytest.hookspec
def pytest_gap_trial_result(
    config: pytest.Config, result: TrialResult, run_dir: Path, replayed: bool
) -> None:
    """A trial of this session was recorded in `run_dir` (its result.json is written).

    Called once per trial item that produced a record, as its report reaches the controller
    (or the single process): a trial that ran (passed, failed, errored, or stopped by the
    watchdog); a trial `--gap-resume` replayed from an earlier session's record (`replayed` is
    True; nothing was re-run); and a trial whose xdist worker died, recorded by the controller
    (exit_code 124 or 137). Not called for trials this session did not select, nor for an item
    that raised before its trial produced a record.
    """


@pytest.hookspec
def pytest_gap_write_outputs(
    config: pytest.Config,
    run_dir: Path,
    summary: RunSummary,
    results: dict[str, TrialResult],
    benchmark: BenchmarkConfig,
) -> None:
    """Write the outputs of one benchmark config's run dir.

    Called once per config that had a trial reported in this session, after every trial, before
    the gate decides the exit status (not in `--collect-only` sessions). `summary` folds every
    result in the run dir, this session's and earlier ones' (a resumed or `--lf` session
    rebuilds the whole summary); `results` are those records keyed by trial dir relative to the
    run dir; `benchmark` is the config (`benchmark.source` is its YAML). Writers must be
    idempotent: the next session over the same run dir calls them again. The done flags are
    written last (`trylast`), so whoever waits for them finds every other output written.

    The evaluation service (`gap serve`) writes a finished run's dir through the harness's own
    implementations but run_manifest.json's (pytest_gap/outputs/hook.py), with `config=None`:
    it runs no pytest session, so a plugin's writers are not called there.
    """


@pytest.hookspec
def pytest_gap_modes(config: pytest.Config) -> Iterable[Mode]:
    """Rows of the mode table (pytest_gap/modes.py `Mode`) this plugin adds.

    Called once per process of a session (the controller and every xdist worker, which must
    answer the same), the first time a benchmark config is loaded; every implementation's rows
    make the session's table, the harness's own first. The same row from two implementations is
    one row; two different rows under one name stop the session with a one-line error. A row
    names its producer by key (`pytest_gap_producers`):

        @pytest.hookimpl(optionalhook=True)
        def pytest_gap_modes(config):
            return [Mode(name="rehearsal", producer="prebuilt", description="dry run")]
    """


@pytest.hookspec
def pytest_gap_producers(config: pytest.Config) -> Mapping[str, str | Producer]:
    """Producers (pytest_gap/producers/base.py `Producer`) this plugin adds, by the key a
    mode's `producer` names: an instance, a class, or a "module:attribute" import string
    (imported the first time a trial of a mode that names it is produced). Called with
    `pytest_gap_modes`, under the same rules."""
