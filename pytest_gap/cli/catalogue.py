"""`gap suites`, `gap families`, `gap skills`, `gap schema`, `gap verify-harness`: what the
harness offers (a backend's suites and families, the skills a workflow can call, the config's
JSON Schema) and whether the vla-eval backend's claims about vla-eval hold.

Each command imports what it runs when it runs (see the package's docstring: the parser stays
light).
"""

from __future__ import annotations

import argparse
import sys


def _cmd_suites(args: argparse.Namespace) -> int:
    from pytest_gap.sim.backend import get_backend

    backend = get_backend(args.backend)
    if args.suite:
        name = args.suite
        n_tasks = backend.n_tasks(name)
        print(f"{name}: {n_tasks} tasks, max_steps {backend.max_steps(name)}")
        for task_id in range(n_tasks):
            n_init = backend.n_init_states(name, task_id)
            print(f"  {task_id:3d}  {n_init:3d} init states  {backend.task_prompt(name, task_id)}")
        return 0
    for name in backend.suites():
        print(f"{name:45s} {backend.n_tasks(name):3d} tasks  max_steps {backend.max_steps(name)}")
    for name, why in backend.unavailable().items():
        print(f"{name:45s} not usable: {why}")
    return 0


def _cmd_families(args: argparse.Namespace) -> int:
    from pytest_gap.sim.backend import declared_control, get_backend

    backend = get_backend(args.backend)
    for name, family in backend.families().items():
        for variation in family.variations():
            line = f"{name + '/' + variation:45s} -> {family.resolve(variation).suite}"
            control = declared_control(backend, name, variation)
            print(f"{line:70s}  control: {'/'.join(control)}" if control else line)
    return 0


def _cmd_verify_harness(args: argparse.Namespace) -> int:
    """Check every claim the vla-eval backend makes about vla-eval internals (claims.py):
    0 all hold, 1 one broke, 2 no vla-eval to check."""
    from pytest_gap.sim.vla_eval.claims import HarnessNotFound, package_dir, verify, version_of

    try:
        root = package_dir(args.source)
    except HarnessNotFound as exc:
        print(f"gap verify-harness: {exc}", file=sys.stderr)
        return 2
    where = "installed" if args.source is None else "source checkout"
    print(f"Verifying harness claims against {where} vla-eval {version_of(root)} ({root})\n")
    verdicts = verify(root)
    width = max(len(v.claim.name) for v in verdicts)
    for v in verdicts:
        mark = "[ok  ]" if v.ok else "[FAIL]"
        found = f"found in {v.where}" if v.ok else f"broken in {v.claim.file}: {v.where}"
        print(f"  {mark} {v.claim.name:{width}s}  {v.claim.statement}")
        print(f"         {'':{width}s}  {found}")
        if not v.ok:
            print(f"         {'':{width}s}  holds up: {v.claim.holds_up}")
    broken = [v for v in verdicts if not v.ok]
    if broken:
        print(
            f"\n{len(broken)} of {len(verdicts)} claims broke: the vla-eval backend is not safe "
            "with this vla-eval; pin vla-eval==0.8.0 or update pytest_gap/sim/vla_eval/."
        )
        return 1
    print(f"\nAll {len(verdicts)} claims hold.")
    return 0


def _cmd_skills(args: argparse.Namespace) -> int:
    import json

    from pytest_gap.skills.catalogue import catalogue

    if args.config:  # its skills.packages join the catalogue (installed packages always do)
        from pytest_gap.config.document import load_config

        load_config(args.config)
    entries = catalogue()
    if args.json:
        print(json.dumps(entries, indent=1))
        return 0
    for entry in entries:
        inputs = ", ".join(entry["inputs"].get("properties", {}))
        print(f"{entry['name']}({inputs})  {entry['description']}")
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    import json

    from pytest_gap.config.document import json_schema

    print(json.dumps(json_schema(), indent=1))
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    """The listing and checking commands, as `gap --help` lists them."""
    suites = subparsers.add_parser(
        "suites", help="list LIBERO / LIBERO-PRO suites, or one suite's tasks"
    )
    suites.add_argument(
        "suite", nargs="?", help="a suite whose tasks to list (default: all suites)"
    )
    families = subparsers.add_parser(
        "families", help="list benchmark families and their variations"
    )
    for listing, func in ((suites, _cmd_suites), (families, _cmd_families)):
        listing.add_argument(
            "--backend", default="libero", help="simulator backend: a name or module:Class"
        )
        listing.set_defaults(func=func)
    skills = subparsers.add_parser("skills", help="list the skills a workflow can call")
    skills.add_argument("--json", action="store_true", help="the machine-readable catalogue")
    skills.add_argument(
        "config", nargs="?", help="a benchmark YAML: list its skills.packages' skills too"
    )
    skills.set_defaults(func=_cmd_skills)
    verify = subparsers.add_parser(
        "verify-harness",
        help="check the vla-eval backend's assumptions about vla-eval (exit 0 ok, 1 broke, "
        "2 vla-eval not importable)",
    )
    verify.add_argument(
        "source", nargs="?", help="a vla-eval source checkout (default: the installed vla-eval)"
    )
    verify.set_defaults(func=_cmd_verify_harness)
    schema = subparsers.add_parser("schema", help="print the benchmark YAML's JSON Schema")
    schema.set_defaults(func=_cmd_schema)
