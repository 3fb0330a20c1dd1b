"""The `gap` command line."""

from __future__ import annotations

import argparse
import sys

from pytest_gap.errors import GapError


def _cmd_suites(args: argparse.Namespace) -> int:
    from pytest_gap.sim.suites import get_suite, list_suites, unusable_suites

    if args.suite:
        suite = get_suite(args.suite)
        print(f"{suite.name}: {suite.n_tasks} tasks, max_steps {suite.max_steps}")
        for task_id in range(suite.n_tasks):
            task = suite.task(task_id)
            print(f"  {task_id:3d}  {task.n_init_states:3d} init states  {task.prompt}")
        return 0
    for name in list_suites():
        suite = get_suite(name)
        print(f"{name:45s} {suite.n_tasks:3d} tasks  max_steps {suite.max_steps}")
    for name, why in unusable_suites().items():
        print(f"{name:45s} not usable: {why}")
    return 0


def _cmd_families(args: argparse.Namespace) -> int:
    from pytest_gap.sim.variations import list_families, resolve

    for family, variations in list_families().items():
        for variation in variations:
            print(f"{family + '/' + variation:45s} -> {resolve(family, variation).suite}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gap", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    suites = sub.add_parser("suites", help="list LIBERO / LIBERO-PRO suites, or one suite's tasks")
    suites.add_argument("suite", nargs="?")
    suites.set_defaults(func=_cmd_suites)
    families = sub.add_parser("families", help="list benchmark families and their variations")
    families.set_defaults(func=_cmd_families)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except GapError as exc:
        print(f"gap: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
