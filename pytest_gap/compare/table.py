"""A comparison as text: the table with its sides, notes and verdict, for a terminal or as
Markdown for a pull request."""

from __future__ import annotations

from pytest_gap.compare.comparison import Comparison
from pytest_gap.compare.stats import RowStats

HEADERS = (
    "cell",
    "pairs",
    "A",
    "B",
    "B-A",
    "95% CI (tasks)",
    "A only",
    "B only",
    "p",
    "p Holm",
    "excluded",
    "verdict",
)


def _num(value: float | None, spec: str = "+.3f") -> str:
    return "-" if value is None else format(value, spec)


def _table_row(r: RowStats) -> list[str]:
    interval = "-" if r.ci_low is None else f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
    excluded = f"{r.n_excluded} ({r.n_infra} infra)" if r.n_infra else str(r.n_excluded)
    return [
        r.cell,
        str(r.n_pairs),
        f"{r.a_success}/{r.n_pairs}",
        f"{r.b_success}/{r.n_pairs}",
        _num(r.diff),
        interval,
        str(r.a_only),
        str(r.b_only),
        _num(r.p_value, ".3g"),
        _num(r.p_holm, ".3g"),
        excluded,
        r.verdict,
    ]


def render(comparison: Comparison, markdown: bool = False) -> str:
    """The table with its sides, notes and verdict: for a terminal, or Markdown for a PR."""
    from tabulate import tabulate

    c = comparison
    same_run = c.a.run == c.b.run
    rows = [_table_row(r) for r in [*c.cells, c.pooled]]
    table = tabulate(
        rows, headers=HEADERS, tablefmt="github" if markdown else "simple", disable_numparse=True
    )
    if c.sequential is not None:
        read = [s.line() for s in c.sequential]
        header = f"sequential (anytime-valid, margin {c.margin:g}, alpha split over the cells):"
        if markdown:
            table += "\n\n" + header + "\n" + "\n".join(f"- {line}" for line in read)
        else:
            table += "\n\n" + header + "\n" + "\n".join(f"  {line}" for line in read)
    where_b = "same run" if same_run else c.b.run
    if c.controls:  # A is each cell's control arm, B the perturbed cell: B-A is minus the drop
        where_b += "; A: each B cell's declared control arm, paired by task and seed"
    if markdown:
        lines = [
            f"**A** `{c.a.row}` ({c.a.run})  ",
            f"**B** `{c.b.row}` ({where_b})",
            "",
            table,
            "",
            *(f"- {note}" for note in c.notes),
            *([""] if c.notes else []),
            f"**{c.verdict()}**",
        ]
    else:
        lines = [
            f"A  {c.a.row}  ({c.a.run})",
            f"B  {c.b.row}  ({where_b})",
            "",
            table,
            "",
            *(f"note: {note}" for note in c.notes),
            c.verdict(),
        ]
    return "\n".join(lines)
