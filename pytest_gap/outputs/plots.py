"""plots/: the run as PNGs, drawn once at session end with matplotlib (nothing per trial).

- success.png: the success pivot as a heatmap (rows mode[@policy], columns family/variation or
  suite), each cell with its rate, 95% Wilson interval and n; errored cells hatched.
- bars_<family>.png: per family, each variation's success rate per row with its interval.
`--gap-no-plots` (or GAP_NO_PLOTS=1) turns them off.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pytest_gap.cell_summary import CellSummary
from pytest_gap.layout import PLOTS_DIR
from pytest_gap.outputs.hook import hookimpl
from pytest_gap.report import RunSummary, pivot

SUITES = "suites"  # the family name a suites-mode cell is drawn under


def _family(cell: CellSummary) -> str:
    return SUITES if cell.suite_name else cell.family


def _file_safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def heatmap(cells: list[CellSummary], path: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    rows, columns, matrix = pivot(cells, "success_rate")
    at = {(c.row, c.column): c for c in cells}
    values = np.full((len(rows), len(columns)), np.nan)
    for i, r in enumerate(rows):
        for j, col in enumerate(columns):
            if isinstance(matrix[r][col], float):
                values[i, j] = matrix[r][col]
    fig, ax = plt.subplots(
        figsize=(max(4.0, 1.7 * len(columns) + 2.5), max(2.0, 0.8 * len(rows) + 1.4))
    )
    # widened limits keep the colours light enough for black text at 0 and 1
    ax.imshow(values, cmap="RdYlGn", vmin=-0.4, vmax=1.4, aspect="auto")
    for i, r in enumerate(rows):
        for j, col in enumerate(columns):
            cell = at.get((r, col))
            if cell is None:
                continue
            if cell.error or cell.success_rate is None:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//"))
                text = "ERR"
            else:
                low, high = cell.success_ci_low, cell.success_ci_high
                text = f"{cell.success_rate:.2f}\n[{low:.2f},{high:.2f}]\nn={cell.n_trials}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_title("success rate (95% Wilson interval)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def family_bars(cells: list[CellSummary], family: str, path: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    rows = list(dict.fromkeys(c.row for c in cells))
    columns = list(dict.fromkeys(c.column for c in cells))
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(columns) * max(1, len(rows)) + 1.5), 3.2))
    for k, row in enumerate(rows):
        xs, rates, low, high = [], [], [], []
        for j, col in enumerate(columns):
            cell = next((c for c in cells if c.row == row and c.column == col), None)
            if cell is None or cell.success_rate is None:
                continue
            xs.append(j - 0.4 + width * (k + 0.5))
            rates.append(cell.success_rate)
            low.append(cell.success_rate - cell.success_ci_low)
            high.append(cell.success_ci_high - cell.success_rate)
        ax.bar(xs, rates, width, yerr=np.array([low, high]), capsize=3, label=row)
    ax.set_xticks(range(len(columns)), [c.split("/", 1)[-1] for c in columns], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate")
    ax.set_title(f"{family} (95% Wilson intervals)", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(run_dir: Path, cells: list[CellSummary]) -> list[Path]:
    """Draw the run's PNGs into run_dir/plots/ and return their paths (none without a cell)."""
    if not cells:
        return []
    import matplotlib

    matplotlib.use("Agg")  # no display; never opens a window on a workstation
    out = run_dir / PLOTS_DIR
    out.mkdir(exist_ok=True)
    written = [out / "success.png"]
    heatmap(cells, written[0])
    families: dict[str, list[CellSummary]] = {}
    for cell in cells:
        families.setdefault(_family(cell), []).append(cell)
    for family, members in families.items():
        path = out / f"bars_{_file_safe(family)}.png"
        family_bars(members, family, path)
        written.append(path)
    return written


NO_PLOTS_ENV = "GAP_NO_PLOTS"


def off_in_environment() -> bool:
    """GAP_NO_PLOTS=1 (anything but empty or 0): a CI job or test suite that never looks."""
    return os.environ.get(NO_PLOTS_ENV, "").strip() not in ("", "0")


@hookimpl
def pytest_gap_write_outputs(config: Any, run_dir: Path, summary: RunSummary) -> None:
    # config: the pytest session's (--gap-no-plots, defaulting to the environment), or None
    # outside one (the evaluation service), where the environment alone says
    off = off_in_environment() if config is None else config.getoption("gap_no_plots", False)
    if not off:
        write_plots(run_dir, summary.cells)
