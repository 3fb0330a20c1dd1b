"""The repo's own use of pytest-gap's hooks: a trend of the main job (`pytest benchmarks/`).

Every session over a config in benchmarks/ appends one line per config to
benchmark_runs/history.tsv (time in UTC, git commit, config, trials, success rate, gate), so the
project sees how its own benchmark moves from commit to commit. Other sessions (`pytest tests`,
a config outside benchmarks/, a `--gap-shard` session: its `gap merge` records the run) are left
alone; the hook costs nothing at import.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

HISTORY = Path("benchmark_runs/history.tsv")
HISTORY_COLUMNS = ("utc_time", "commit", "config", "n_trials", "n_success", "success_rate", "gate")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def _commit(root: Path) -> str:
    """The checkout's commit, `+dirty` when it has uncommitted changes; `-` outside git."""
    try:
        head = _git(root, "rev-parse", "--short=12", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "-"
    return head + ("+dirty" if dirty else "")


@pytest.hookimpl(optionalhook=True)  # the module loads with `-p no:gap` too
def pytest_gap_write_outputs(config: pytest.Config, summary, benchmark) -> None:
    root = config.rootpath
    source = Path(benchmark.source)
    if (root / "benchmarks") not in source.parents:
        return
    if config.getoption("gap_shard", None):  # a part of the plan: its merge is the trend point
        return
    gate = summary.gate
    row = (
        datetime.now(UTC).isoformat(timespec="seconds"),
        _commit(root),
        source.relative_to(root).as_posix(),
        str(gate.n_trials),
        str(gate.n_success),
        f"{gate.success_rate:.3f}",
        gate.verdict,  # PASS, FAIL or INCONCLUSIVE (gate_rule: wilson)
    )
    path = root / HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.is_file()
    with path.open("a") as history:
        if new:
            history.write("\t".join(HISTORY_COLUMNS) + "\n")
        history.write("\t".join(row) + "\n")
