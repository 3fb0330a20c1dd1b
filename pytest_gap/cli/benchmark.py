"""`gap benchmark` and `gap merge`: run a benchmark config (whole, or one shard of it) and put
shards' run dirs together into one.

Each command imports what it runs when it runs (see the package's docstring: the parser stays
light).
"""

from __future__ import annotations

import argparse
import sys

from pytest_gap.errors import GapError


def _cmd_benchmark(args: argparse.Namespace) -> int:
    """Exit 0 success (gate PASS), 1 run exception, gate FAIL or a service the preflight found
    down (gate or not: the cells that need it errored without running), 2 config problem."""
    from pytest_gap.benchmark import BenchmarkRunError, run

    if args.ray and args.n:
        raise GapError("--ray runs the trials on Ray actors, -n on xdist workers: drop one of them")
    try:
        summary = run(
            args.config,
            gate=args.gate,
            resume=args.resume,
            families=args.families,
            modes=args.modes,
            output_dir=args.output_dir,
            workers=args.n,
            ray=args.ray,
            shard=args.shard,
            verbose=args.verbose,
            baseline=args.baseline,
        )
    except BenchmarkRunError as exc:
        print(f"gap: error: {exc}", file=sys.stderr)
        return 1
    print(f"run dir: {summary.run_dir}")
    print(summary.gate_line)
    print_errored_cells(summary.cells, summary.services_down)
    return 0 if summary.ok else 1  # ok: the gate (gated) or a finished session, no service down


def print_errored_cells(cells, services_down: dict[str, str]) -> None:
    """Why cells errored (a policy server that did not start, an LLM that did not answer): one
    line per reason, naming its cells, so the gate's "errored cells" is never the last word.
    A service found down is said once: in its cells' line (the reason names the url and the
    fix), or on a line of its own when no cell recorded here carries it."""
    reasons: dict[str, list[str]] = {}
    for cell in cells:
        if cell.error:
            reasons.setdefault(" ".join(cell.error.split()), []).append(f"{cell.row} {cell.column}")
    for why, names in reasons.items():
        print(f"gap: errored {', '.join(names)}: {why}", file=sys.stderr)
    for why in (" ".join(w.split()) for w in services_down.values()):
        if not any(why in reason for reason in reasons):
            print(f"gap: error: {why}", file=sys.stderr)


def _cmd_merge(args: argparse.Namespace) -> int:
    """Exit 0 the merged run's gate passes, 1 it does not, 2 the merge was refused (one line:
    different plans, missing trials without --allow-partial, an --out that is not new)."""
    from pathlib import Path

    from pytest_gap.scale.merge import SHOWN
    from pytest_gap.scale.merge_session import merge

    outcome = merge(
        [Path(r) for r in args.runs],
        Path(args.out),
        config=Path(args.config) if args.config else None,
        allow_partial=args.allow_partial,
    )
    shards = f" (shards {', '.join(outcome.shards)})" if outcome.shards else ""
    print(f"merged {len(outcome.inputs)} run dirs{shards} into {outcome.out}")
    print(f"trials: {outcome.merged} of {outcome.planned} planned have a record")
    if outcome.duplicates:
        print(f"duplicates: {len(outcome.duplicates)} trials recorded in more than one input")
        for dup in outcome.duplicates[:SHOWN]:
            print(f"  {dup.trial}: kept {dup.kept} ({dup.rule})")
        if len(outcome.duplicates) > SHOWN:
            print(f"  ... (+{len(outcome.duplicates) - SHOWN} more: run_manifest.json merged_from)")
    if outcome.not_planned:
        print(f"left out: {outcome.not_planned} records of trials this plan does not have")
    for note in outcome.notes:
        print(f"gap: {note}", file=sys.stderr)
    print(outcome.gate_line)
    return 0 if outcome.passed else 1


def add(subparsers: argparse._SubParsersAction) -> None:
    """`gap benchmark` and `gap merge`."""
    bench = subparsers.add_parser(
        "benchmark", help="run a benchmark config (pytest on it) and gate it"
    )
    bench.add_argument("config", help="benchmark YAML (grid or suites shape)")
    bench.add_argument("--gate", action="store_true", help="exit 1 unless the gate passes")
    bench.add_argument("--resume", action="store_true", help="reuse the latest run dir")
    bench.add_argument("--families", nargs="+", help="only these families (grid configs)")
    bench.add_argument("--modes", nargs="+", help="only these modes (grid configs)")
    bench.add_argument("--output-dir", help="write the run dir here instead of the config's")
    bench.add_argument(
        "-n", type=int, help="parallel trial workers (default: the config's num_workers)"
    )
    bench.add_argument(
        "--ray",
        metavar="auto|ADDRESS",
        help="run the trials on a Ray cluster (pytest --gap-ray; not with -n)",
    )
    bench.add_argument(
        "--shard",
        metavar="K/N",
        help="run shard K of N of the plan (pytest --gap-shard); put the N run dirs together "
        "with gap merge",
    )
    bench.add_argument(
        "--baseline",
        metavar="RUN_DIR_OR_PARQUET",
        help="gate against this baseline run instead of the threshold: fail where the trials "
        "are worse than the baseline's on the same episodes by more than gate.margin",
    )
    bench.add_argument("-v", "--verbose", action="store_true", help="verbose pytest output")
    bench.set_defaults(func=_cmd_benchmark)
    merge = subparsers.add_parser(
        "merge",
        help="merge shards' run dirs (one config, one plan) into one run dir: de-duplicated, "
        "coverage checked, summaries, parquet and gate rebuilt (exit 0 gate passes, 1 fails, "
        "2 refused)",
    )
    merge.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="run dirs, or output dirs holding them"
    )
    merge.add_argument("--out", required=True, help="the merged run dir to create (new or empty)")
    merge.add_argument(
        "--config", help="the benchmark YAML the inputs ran (default: the path they recorded)"
    )
    merge.add_argument(
        "--allow-partial",
        action="store_true",
        help="write the merge even when planned trials have no record (its gate fails on them)",
    )
    merge.set_defaults(func=_cmd_merge)
