"""The `gap` command line: one module per command group, each with `add(subparsers)`.

A group's `add` puts its commands on the `gap` parser, each with its function as `func`
(argparse's own idiom: the function is named beside its parser, so no second table of names
has to be kept in step); `main` parses and calls `args.func(args)`. What several groups share
(argument types, the bearer token) is in `common`; a group imports no other group.

Building the parser imports nothing heavy: a command imports the modules it runs (the simulator,
pytest, the service) inside its function, so `gap --help` or a usage error does not pay for
them, and `gap suites | head` starts as fast as the backend allows.
"""

from __future__ import annotations

import argparse
import sys

from pytest_gap.cli import benchmark, catalogue, online, policy, reports, service, workflows
from pytest_gap.errors import GapError

DESCRIPTION = "The `gap` command line."
GROUPS = (catalogue, workflows, benchmark, policy, reports, service, online)
# The order `gap --help` lists the commands in: as it was before they were split into groups.
HELP_ORDER = (
    "suites",
    "families",
    "skills",
    "run",
    "benchmark",
    "policy",
    "generate",
    "verify-harness",
    "compare",
    "serve",
    "submit",
    "eval",
    "status",
    "online",
    "viz",
    "dataset",
    "merge",
    "schema",
)


def _in_help_order(subparsers: argparse._SubParsersAction) -> None:
    """List the commands in HELP_ORDER, in the usage line and in the help (argparse lists them
    in the order they were added, which is by group); a command HELP_ORDER does not name comes
    last, in its group's order."""
    rank = {name: i for i, name in enumerate(HELP_ORDER)}
    parsers = sorted(subparsers.choices.items(), key=lambda item: rank.get(item[0], len(rank)))
    subparsers.choices.clear()
    subparsers.choices.update(parsers)
    # argparse has no public way to order the help's list: the pseudo-actions it prints from
    subparsers._choices_actions.sort(key=lambda action: rank.get(action.dest, len(rank)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gap", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add(sub)
    _in_help_order(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except GapError as exc:  # one problem a line, each labelled (a peer's words among them)
        for line in str(exc).split("\n"):
            print(f"gap: error: {line}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `gap suites | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0
