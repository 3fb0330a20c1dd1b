"""`gap compare`, `gap viz` and `gap dataset`: read finished run dirs (a paired comparison of two
rows, an HTML report, the episodes as a LeRobot dataset).

Each command imports what it runs when it runs (see the package's docstring: the parser stays
light).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from pytest_gap.errors import GapError


def _cmd_compare(args: argparse.Namespace) -> int:
    """Exit 0 B not significantly worse than A, 1 it is (after Holm), 2 the comparison cannot be
    made (each reason one line) or an input to fix."""
    import json
    from pathlib import Path

    from pytest_gap.compare import CompareRefused, compare, load_run, render

    if len(args.runs) > 2:
        raise GapError(
            f"gap compare: give one run dir (with --a and --b) or two, not {len(args.runs)}"
        )
    paths = list(dict.fromkeys(Path(r).resolve() for r in args.runs))  # RUN RUN: one run
    run_a = load_run(args.runs[0])
    run_b = load_run(args.runs[1]) if len(paths) == 2 else None
    try:
        result = compare(
            run_a,
            run_b,
            args.a,
            args.b,
            allow_harness_mismatch=args.allow_harness_mismatch,
            alpha=args.alpha,
            sequential=(args.margin, args.block_seeds) if args.sequential else None,
            controls=args.controls,
        )
    except CompareRefused as exc:
        if args.json:
            print(json.dumps({"refused": exc.reasons, "exit_code": 2}, indent=1))
        for reason in exc.reasons:
            print(f"gap compare: refused: {reason}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(render(result, markdown=args.markdown))
    return result.exit_code


def _cmd_viz(args: argparse.Namespace) -> int:
    """Write the HTML report (exit 0, its path printed) or serve it until interrupted."""
    from pathlib import Path

    from pytest_gap.viz.model import check_run_dir

    if len(args.runs) > 2:
        raise GapError(f"gap viz: give one run dir, or two to compare, not {len(args.runs)}")
    runs = [Path(r) for r in args.runs]
    for run in runs:
        check_run_dir(run)
    run, against = runs[-1], (runs[0] if len(runs) == 2 else None)
    if args.serve:
        from pytest_gap.viz.serve import make_server

        server = make_server(run, args.port, against=against)
        host, port = server.server_address[:2]
        print(f"gap viz: serving {run} at http://{host}:{port}/ (Ctrl-C stops)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
        server.server_close()
        return 0
    from pytest_gap.viz.html import write_report

    print(write_report(run, Path(args.out) if args.out else None, against=against))
    return 0


def _cmd_dataset(args: argparse.Namespace) -> int:
    """Write a run dir's recorded episodes (trials.dataset) as a LeRobot dataset at --out."""
    from pathlib import Path

    from pytest_gap.outputs.lerobot import write_dataset
    from pytest_gap.results import scan_results
    from pytest_gap.viz.model import check_run_dir

    run = Path(args.run)
    check_run_dir(run)
    out = Path(args.out)
    if out.exists() and not args.force:
        raise GapError(f"gap dataset: {out} exists; give another --out, or --force to replace it")
    report = write_dataset(run, scan_results(run), out, only_success=args.only_success)
    for key, why in report.skipped.items():
        print(f"gap dataset: left out {key}: {why}", file=sys.stderr)
    if not report.episodes:
        raise GapError(
            f"gap dataset: no episode of {run} to write: its trials recorded no dataset frames "
            "(set trials.dataset in its config and run it again)"
            if not report.skipped
            else f"gap dataset: none of the {len(report.skipped)} recorded trials of {run} "
            "went in (above: why)"
        )
    print(report.line())
    return 0


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability between 0 and 1")
    return value


def add(subparsers: argparse._SubParsersAction) -> None:
    """`gap compare` and `gap viz`."""
    comp = subparsers.add_parser(
        "compare",
        help="paired comparison of two rows (B against A): exit 0 B not worse, 1 B significantly "
        "worse, 2 cannot compare",
    )
    comp.add_argument(
        "runs", nargs="+", metavar="RUN", help="a run dir (two rows: --a, --b) or two run dirs"
    )
    comp.add_argument(
        "--a", metavar="ROW", help="row A as the pivot labels it, e.g. policy_only@base"
    )
    comp.add_argument("--b", metavar="ROW", help="row B, e.g. policy_only@candidate")
    comp.add_argument(
        "--allow-harness-mismatch",
        action="store_true",
        help="compare even when the harness_surface differs (the changed files are listed)",
    )
    comp.add_argument(
        "--alpha", type=_probability, default=0.05, help="significance level (default 0.05)"
    )
    comp.add_argument(
        "--sequential",
        action="store_true",
        help="read each cell as an anytime-valid sequential test (B worse / B better / B not "
        "worse than A within --margin, or undecided): valid on runs still running or stopped "
        "early, however often it is run",
    )
    comp.add_argument(
        "--margin",
        type=_probability,
        default=0.05,
        help="--sequential: how much worse B may be and count as not worse (default 0.05)",
    )
    comp.add_argument(
        "--block-seeds",
        type=_positive_int,
        default=5,
        help="--sequential: seeds of every task per look (default 5)",
    )
    comp.add_argument(
        "--controls",
        action="store_true",
        help="B's perturbed cells (posvar, LIBERO-PRO variants) against the control arms their "
        "families declare, found in A (one run: --a/--b default to its one row), paired by task "
        "and seed: exit 1 when a perturbation makes B significantly worse",
    )
    output = comp.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="machine-readable output")
    output.add_argument("--markdown", action="store_true", help="a Markdown table (PR comment)")
    comp.set_defaults(func=_cmd_compare)
    viz = subparsers.add_parser(
        "viz",
        help="an HTML report of a run dir (RUN_A RUN_B: of RUN_B, compared with RUN_A)",
    )
    viz.add_argument("runs", nargs="+", metavar="RUN", help="a run dir, or two to compare")
    viz.add_argument("--out", help="where to write the report (default: RUN/report.html)")
    viz.add_argument("--serve", action="store_true", help="serve it on loopback instead")
    viz.add_argument("--port", type=int, default=0, help="--serve's port (default: any free)")
    viz.set_defaults(func=_cmd_viz)
    dataset = subparsers.add_parser(
        "dataset",
        help="a run dir's episodes as a LeRobot v3 dataset (its trials ran with trials.dataset)",
    )
    dataset.add_argument("run", metavar="RUN", help="a run dir")
    dataset.add_argument("--out", required=True, help="the dataset's directory")
    dataset.add_argument(
        "--only-success", action="store_true", help="only the episodes that succeeded"
    )
    dataset.add_argument("--force", action="store_true", help="replace a dataset at --out")
    dataset.set_defaults(func=_cmd_dataset)
