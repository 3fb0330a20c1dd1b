"""`gap online serve|submit|ready|status`: the online platform (queued evaluation tasks, each
given an evaluation server of its own) and its client.

Each command imports what it runs when it runs (see the package's docstring: the parser stays
light).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from pytest_gap.cli.common import bearer_token, log_to_stderr, positive_float, positive_int
from pytest_gap.errors import GapError, peer_text_escaped, shown


def _cmd_online_serve(args: argparse.Namespace) -> int:
    import signal
    import threading
    from pathlib import Path

    from pytest_gap.service.online import make_platform_server
    from pytest_gap.service.platform import Limits, Platform, load_sets, load_tokens

    log_to_stderr("gap online")
    limits = _limits(args, Limits)
    platform = Platform(
        Path(args.runs_dir),
        load_sets(Path(args.sets)),
        load_tokens(Path(args.tokens)),
        args.capacity,
        limits,
    )
    server = make_platform_server(platform, args.host, args.port)
    watcher = threading.Thread(target=platform.watch, daemon=True)
    watcher.start()
    host, port = server.server_address[:2]
    print(f"gap online: http://{host}:{port}/ capacity {args.capacity}", flush=True)
    # SIGTERM (a supervisor, `kill`) stops it as Ctrl-C does: its task servers go with it
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    finally:
        platform.stop()
        server.server_close()
    return 0


def _limits(args: argparse.Namespace, model):
    """The platform's Limits from its options; a value past a limit's bound is one line naming
    the option (positive_int/positive_float keep out the rest)."""
    from pydantic import ValidationError

    given = {name: getattr(args, name, None) for name in model.model_fields}
    try:
        return model(**{name: value for name, value in given.items() if value is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0])
        flag = "--" + name.replace("_", "-")
        raise GapError(f"{flag} {given[name]}: {first['msg'].lower()}") from None


def _online_token(args: argparse.Namespace) -> str:
    token = args.token or bearer_token(args)
    if not token:
        raise GapError("give the platform token: --token T or --token-file F")
    return token


def _ready_json(task: dict) -> dict:
    """What a ready task's client needs: where to attach (`endpoint`), as which run (`task_id`),
    with which secret (`run_secret`) and token (`client_token`: it opens that run's doors of the
    task's server only; the platform token opens none there)."""
    keys = ("task_id", "endpoint", "run_secret", "client_token")
    return {k: task.get(k) for k in keys}


@peer_text_escaped()  # the platform's refusals and a task's error are its words
def _cmd_online_submit(args: argparse.Namespace) -> int:
    """Exit 0 ready (its endpoint printed), 1 still queued when --timeout ran out, 2 refused."""
    import json
    import time

    from pytest_gap.service.client import online_submit, online_task

    token = _online_token(args)
    task = online_submit(
        args.base_url, token, args.model_name, args.benchmark_set, args.idempotency_key
    )
    deadline = time.monotonic() + args.timeout
    while task["state"] == "queued" and time.monotonic() < deadline:
        time.sleep(1.0)
        task = online_task(args.base_url, token, task["task_id"])
    if task["state"] == "ready":
        if args.print_endpoint:
            print(json.dumps(_ready_json(task)))
        else:
            print(f"task {shown(task['task_id'])} ready: {shown(task['endpoint'])}")
        return 0
    if task["state"] == "queued":
        shown_id = shown(task["task_id"])
        print(
            f"task {shown_id} is still queued after {args.timeout:g} s; it may still "
            f"run: check with `gap online ready --task-id {shown_id}` (do not submit again)",
            file=sys.stderr,
        )
        return 1
    raise GapError(f"task {task['task_id']} is {task['state']}: {task.get('error')}")


@peer_text_escaped()
def _cmd_online_ready(args: argparse.Namespace) -> int:
    """Exit 0 ready (endpoint JSON printed), 1 not (its state printed)."""
    import json

    from pytest_gap.service.client import online_task

    task = online_task(args.base_url, _online_token(args), args.task_id)
    if task["state"] == "ready":
        print(json.dumps(_ready_json(task)))
        return 0
    print(
        f"task {shown(task['task_id'])}: {shown(task['state'])}"
        + (f": {shown(task['error'])}" if task.get("error") else "")
    )
    return 1


@peer_text_escaped()
def _cmd_online_status(args: argparse.Namespace) -> int:
    """One line a task, every string of the platform's answer escaped (errors.shown)."""
    from pytest_gap.service.client import online_tasks

    for task in online_tasks(args.base_url, _online_token(args)):
        where = f" at {shown(task['endpoint'])}" if task.get("endpoint") else ""
        what = f"{shown(task['model_name'])} on {shown(task['benchmark_set'])}"
        print(f"{shown(task['task_id'])}  {shown(task['state']):8s} {what}{where}")
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    """`gap online` and its subcommands."""
    online = subparsers.add_parser("online", help="the online platform: queued evaluation tasks")
    online_sub = online.add_subparsers(dest="online_command", required=True)
    oserve = online_sub.add_parser("serve", help="take tasks; start evaluation servers for them")
    oserve.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (loopback only)"
    )
    oserve.add_argument("--port", type=int, default=8780, help="the port to listen on")
    oserve.add_argument("--runs-dir", default="online_runs", help="where the tasks' runs are kept")
    oserve.add_argument("--sets", required=True, help="YAML {benchmark set: config path}")
    oserve.add_argument("--tokens", required=True, help="a file of `TOKEN OWNER` lines")
    oserve.add_argument("--capacity", type=int, default=1, help="evaluation servers at once")
    for name, kind, text in (  # unset: service.platform.Limits' defaults
        ("max_tasks_per_owner", positive_int, "tasks queued or ready per token (default 4)"),
        ("max_queued", positive_int, "tasks queued, all owners (default 32)"),
        ("attach_timeout_s", positive_float, "a ready task nobody attaches to ends (300)"),
        ("request_timeout_s", positive_float, "a connection idle this long is closed (10)"),
    ):
        oserve.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
    oserve.set_defaults(func=_cmd_online_serve)
    for name, func, text in (
        ("submit", _cmd_online_submit, "create a task and wait until it is ready"),
        ("ready", _cmd_online_ready, "is a task ready? its endpoint if so"),
        ("status", _cmd_online_status, "your tasks and their states"),
    ):
        cmd = online_sub.add_parser(name, help=text)
        cmd.add_argument("--base-url", required=True, help="the platform, http://HOST:PORT")
        cmd.add_argument("--token", help="your platform token (or --token-file)")
        cmd.add_argument("--token-file", help="a file holding your platform token")
        if name == "submit":
            cmd.add_argument(
                "--model-name", required=True, help="what your task evaluates: a name of yours"
            )
            cmd.add_argument(
                "--benchmark-set", required=True, help="one of the platform's benchmark sets"
            )
            cmd.add_argument(
                "--timeout",
                type=positive_float,
                default=600.0,
                help="seconds to wait for the task to be ready (exit 1 if still queued)",
            )
            cmd.add_argument(
                "--print-endpoint", action="store_true", help="print the ready task as JSON"
            )
            cmd.add_argument("--idempotency-key", help="a retried submit with it never duplicates")
        if name == "ready":
            cmd.add_argument("--task-id", required=True, help="the task gap online submit made")
        cmd.set_defaults(func=func)
