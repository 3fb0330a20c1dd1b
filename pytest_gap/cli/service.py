"""`gap serve`, `gap submit`, `gap eval`, `gap status`: the evaluation server, and the client
side that schedules a run on it, attaches a policy to it and asks where it stands.

Each command imports what it runs when it runs (see the package's docstring: the parser stays
light).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from pytest_gap.cli.common import bearer_token, log_to_stderr
from pytest_gap.errors import GapError, peer_text_escaped, shown

# After its last episode a worker's line waits this long at most for the run to be `finished`:
# once every episode is saved, the run is finished when its other clients have been told too.
SETTLE_S = 10.0


def _client_token(args: argparse.Namespace, url: str) -> str | None:
    """bearer_token, else the token `gap serve` on this machine wrote for the url's port."""
    from pytest_gap.service.client import local_token

    return bearer_token(args) or local_token(url)


def _run_secret(args: argparse.Namespace) -> str | None:
    """--run-secret-file, else GAP_RUN_SECRET (taken out of the environment), else the secret
    `gap submit` kept on this machine for the server and run id."""
    from pathlib import Path

    from pytest_gap.doors import read_secret, take_env
    from pytest_gap.service.client import stored_run_secret
    from pytest_gap.service.protocol import RUN_SECRET_ENV

    from_env = take_env(RUN_SECRET_ENV)
    if args.run_secret_file:
        return read_secret(Path(args.run_secret_file), f"--run-secret-file {args.run_secret_file}")
    return from_env or stored_run_secret(args.url, args.run_id)


def _serve_token(args: argparse.Namespace) -> tuple[str | None, bool]:
    """(the server's token, whether it was made here): --token-file or GAP_TOKEN as given,
    none with --no-token, else a new one."""
    from pytest_gap.doors import new_secret

    given = bearer_token(args)
    if args.no_token:
        if given:
            raise GapError("--no-token: drop --token-file and GAP_TOKEN, or drop --no-token")
        return None, False
    return (given, False) if given else (new_secret(), True)


def _serve_limits(args: argparse.Namespace):
    """The server's limits from its `--max-...` options (unset: limits.py's defaults); a value
    past a limit's ceiling is a one-line error naming the option."""
    from pytest_gap.service.limits import OPTION, ServiceLimits

    given = {name: getattr(args, name, None) for name in OPTION}
    try:
        return ServiceLimits(**{k: v for k, v in given.items() if v is not None})
    except ValueError as exc:  # one line, naming the option and its range
        raise GapError(str(exc)) from None


def _run_client_token(args: argparse.Namespace) -> str | None:
    """GAP_CLIENT_TOKEN (taken out of the environment): the second token of the operator's run
    (`--config`), which opens that run's doors only; the online platform mints one per task."""
    from pytest_gap.doors import take_env
    from pytest_gap.service.protocol import CLIENT_TOKEN_ENV

    given = take_env(CLIENT_TOKEN_ENV)
    if given and (not args.config or args.no_token):
        raise GapError(
            f"{CLIENT_TOKEN_ENV} opens the run of --config and --run-id only, beside the "
            "server's own token: give both (and no --no-token), or unset it"
        )
    return given or None


def _operator_run(args: argparse.Namespace, splits, limits):
    """The operator's `--config` run, registered (trusted, by a door no client has), and the
    secret whoever started this server chose for it (gap online hands it to the task's owner;
    None: one is made, and written where `gap eval` looks for it). (None, None) without one."""
    from pathlib import Path

    from pytest_gap.doors import take_env
    from pytest_gap.service.protocol import RUN_SECRET_ENV
    from pytest_gap.service.runs import register

    if not args.config:
        return None, None
    chosen = take_env(RUN_SECRET_ENV)
    runs_dir = Path(args.runs_dir).resolve()
    registered = register(runs_dir, args.run_id, Path(args.config), splits, chosen, limits)
    print(f"gap serve: {registered.message}", flush=True)
    return registered, chosen


def _cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal
    from pathlib import Path

    from pytest_gap.doors import remove_secret, run_secret_path, server_token_path, write_secret
    from pytest_gap.service.server import EvalServer
    from pytest_gap.service.splits import load_splits

    log_to_stderr("gap serve")
    logging.getLogger("websockets").setLevel(logging.WARNING)  # not a line per connection
    splits = load_splits(Path(args.splits)) if args.splits else None
    if bool(args.config) != bool(args.run_id):
        raise GapError("gap serve: give --config and --run-id together (the operator's run)")
    token, made = _serve_token(args)
    limits, client_token = _serve_limits(args), _run_client_token(args)
    registered, chosen = _operator_run(args, splits, limits)
    server = EvalServer(
        Path(args.runs_dir),
        host=args.host,
        port=args.port,
        token=token,
        splits=splits,
        limits=limits,
        client_token=client_token,
        client_run=args.run_id if client_token else None,
    )
    written: list[Path] = []

    async def main() -> None:
        started = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(server.serve(started))
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():  # it never listened (the port is taken)
            try:
                task.result()
            except OSError as exc:
                raise GapError(f"--port {args.port}: cannot listen: {exc.strerror}") from None
        port = started.result()
        if token is None:
            logging.warning(
                "--no-token: anyone who can reach port %d can submit runs and attach to them; "
                "drop --no-token to have a token made",
                port,
            )
        elif made:  # written once the port is known: a port already taken overwrites nothing
            written.append(write_secret(server_token_path(port), token))
            print(f"gap serve: token in {written[-1]} (local gap submit/eval/status read it)")
        if registered is not None and registered.run_secret and not chosen:
            where = run_secret_path(args.host, port, args.run_id)
            write_secret(where, registered.run_secret)
            print(f"gap serve: run {args.run_id}'s secret in {where}", flush=True)
        print(f"gap serve: http://{args.host}:{port}/ runs in {server.runs_dir}", flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(main())
    finally:
        for path in written:  # a stopped server's token opens nothing
            remove_secret(path, token)
    return 0


@peer_text_escaped()  # a server's refusal is printed as its words
def _cmd_submit(args: argparse.Namespace) -> int:
    """Prints the outcome; the run secret goes to a 0600 file of this user's (its path printed)
    or, with --json, to stdout alone."""
    import json
    from pathlib import Path

    from pytest_gap.service.client import run_secret_file, store_run_secret, submit

    url = f"{args.host}:{args.port}"
    done = submit(url, Path(args.config), args.run_id, _client_token(args, url))
    if args.json:
        print(json.dumps(done.model_dump(mode="json")))
        return 0
    if done.run_secret:
        path = store_run_secret(url, args.run_id, done.run_secret)
        print(f"{shown(done.message)}; run secret in {path} (gap eval on this machine reads it)")
    else:
        kept = run_secret_file(url, args.run_id)
        print(shown(done.message) + (f"; run secret in {kept}" if kept.is_file() else ""))
    return 0


@peer_text_escaped()
def _cmd_status(args: argparse.Namespace) -> int:
    """Every string of the server's answer is printed escaped (errors.shown): a worker's host
    or a forged gate line cannot add lines, move the cursor or clear the terminal."""
    import json

    from pytest_gap.service.client import run_status

    status = run_status(args.url, args.run_id, _client_token(args, args.url))
    if args.json:  # JSON escapes every control character itself
        print(json.dumps(status.model_dump(mode="json"), indent=1))
        return 0
    print(
        f"run {shown(status.run_id)}: {shown(status.state)}; {status.saved}/{status.expected} "
        f"episodes saved, {status.in_progress} in progress, {status.remaining} remaining"
        + (f", {status.infra_failures} handed out again" if status.infra_failures else "")
        + (f", {status.given_up} given up (missing)" if status.given_up else "")
        + (f", {status.smoke_episodes} smoke (not scored)" if status.smoke_episodes else "")
    )
    for w in status.workers:
        doing = f", running {shown(w.current)}" if w.current else ""
        smoke = " [smoke]" if w.smoke else ""
        why = f": {shown(w.reason)}" if w.reason and w.state != "attached" else ""
        print(
            f"  worker {w.worker_id}{smoke}: {shown(w.state)} ({shown(w.host)}), "
            f"{w.episodes_done} done{doing}{why}"
        )
    for reason in status.given_up_reasons:
        print(f"  given up: {shown(reason)}")
    if status.gate:
        print(shown(status.gate))
    return 0


def _run_id(text: str) -> str:
    from pytest_gap.service.protocol import check_run_id

    try:
        return check_run_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _worker_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give distinct worker ids >= 0, comma-separated (e.g. 0,1)"
        )
    return ids


def _policy_headers(args: argparse.Namespace) -> dict[str, str]:
    """The credentials `--policy` wants, from the variables --policy-api-key-env and
    --policy-header NAME=VARIABLE name (policies/credentials.py: values never on a command line,
    where `ps` shows them)."""
    import os

    from pytest_gap.policies.credentials import (
        credential_headers,
        env_name_problem,
        header_name_problem,
    )

    named: dict[str, str] = {}
    for given in args.policy_header or []:
        header, _, variable = given.partition("=")
        # never the value given: a user who wrote the secret itself would see it echoed
        problem = header_name_problem(header) or (
            env_name_problem(variable) and "after '=' comes a variable's name"
        )
        if problem:
            raise GapError(f"gap eval --policy-header {header}=...: {problem}; write NAME=VARIABLE")
        named[header] = variable
    key_env = args.policy_api_key_env
    problem = key_env and env_name_problem(key_env)
    if problem:
        raise GapError(f"gap eval --policy-api-key-env: {problem}")
    for variable in [key_env, *named.values()]:
        if variable and not os.environ.get(variable):
            raise GapError(
                f"gap eval: the variable {variable} is not set; export it (its value is what "
                "--policy wants) or leave it out"
            )
    return credential_headers("gap eval", key_env, named)


@peer_text_escaped()  # the evaluation server's and the policy server's errors
def _cmd_eval(args: argparse.Namespace) -> int:
    """One process per worker id (as EBench's clients): several ids start one `gap eval` each.
    Exit 0 when the run finished with every episode saved, 1 when episodes are missing."""
    import subprocess

    from pytest_gap.service.client import FAKE_REPLY, EvalClient, policy_act, run_status

    if args.policy is None and not args.fake_actions:
        raise GapError(
            "gap eval: give --policy ws://HOST:PORT (the model server), or --fake-actions"
        )
    token, run_secret = _client_token(args, args.url), _run_secret(args)
    if len(args.worker_ids) > 1:
        import os

        from pytest_gap.service.protocol import RUN_SECRET_ENV, TOKEN_ENV

        base = [sys.executable, "-m", "pytest_gap.cli", "eval", "--url", args.url]
        base += ["--run-id", args.run_id, "--protocol", args.protocol]
        base += ["--policy", args.policy] if args.policy else ["--fake-actions"]
        if args.policy_api_key_env:  # names only: each worker reads the values itself
            base += ["--policy-api-key-env", args.policy_api_key_env]
        for header in args.policy_header or []:
            base += ["--policy-header", header]
        # The secrets this process holds go to its workers the way it took them: not argv.
        secrets_env = {TOKEN_ENV: token or "", RUN_SECRET_ENV: run_secret or ""}
        env = {**os.environ, **{k: v for k, v in secrets_env.items() if v}}
        children = [
            subprocess.Popen([*base, "--worker-ids", str(worker)], env=env)
            for worker in args.worker_ids
        ]
        return max(child.wait() for child in children)
    (worker,) = args.worker_ids
    if args.fake_actions:
        act, metadata = (lambda obs: FAKE_REPLY), {}
    else:
        act, metadata = policy_act(args.policy, args.protocol, _policy_headers(args))
    client = EvalClient(
        args.url,
        args.run_id,
        worker,
        token=token,
        smoke=args.fake_actions,
        metadata=metadata,
        run_secret=run_secret,
    )
    finished = client.run(act)
    if args.fake_actions:
        print(
            f"worker {worker}: smoke episode answered ({client.answered} observations); not scored"
        )
        return 0
    status = run_status(args.url, args.run_id, token)
    deadline = time.monotonic() + SETTLE_S
    settling = status.saved >= status.expected
    while settling and status.state != "finished" and time.monotonic() < deadline:
        time.sleep(0.2)
        status = run_status(args.url, args.run_id, token)
    print(
        f"worker {worker}: answered {client.answered} observations; run {args.run_id} "
        f"{shown(status.state)}, {status.saved}/{status.expected} episodes saved"
    )
    if finished.get("saved", 0) < finished.get("expected", 0) and status.saved < status.expected:
        print(
            f"gap eval: run {args.run_id} ended with {status.expected - status.saved} episodes "
            "missing",
            file=sys.stderr,
        )
        return 1
    return 0


def _limit_options(serve: argparse.ArgumentParser) -> None:
    """`gap serve`'s limits (service/limits.py; unset: its defaults, in the help)."""
    from pytest_gap.cli.common import positive_int
    from pytest_gap.service import limits as defaults

    for name, default, text in (
        ("max_trials_per_run", defaults.DEFAULT_MAX_TRIALS, "trials one run may plan"),
        ("max_steps_per_run", defaults.DEFAULT_MAX_STEPS, "steps a run's trials may take"),
        ("max_runs", defaults.DEFAULT_MAX_RUNS, "submitted runs the runs dir may hold"),
        (
            "max_attachments_per_run",
            defaults.DEFAULT_MAX_ATTACHMENTS_PER_RUN,
            "clients attached to one run (worker ids 0 to this less one)",
        ),
        ("max_attachments", defaults.DEFAULT_MAX_ATTACHMENTS, "clients attached, all runs"),
        (
            "max_trial_handouts",
            defaults.DEFAULT_MAX_HANDOUTS,
            "unscored ends of a trial before it is given up",
        ),
        (
            "max_worker_failures",
            defaults.DEFAULT_MAX_WORKER_FAILURES,
            "trials in a row a client fails before its worker id is refused",
        ),
    ):
        flag = defaults.OPTION[name]
        serve.add_argument(flag, dest=name, type=positive_int, help=f"{text} (default {default})")


def add(subparsers: argparse._SubParsersAction) -> None:
    """`gap serve`, `gap submit`, `gap eval`, `gap status`."""
    serve = subparsers.add_parser(
        "serve", help="the evaluation server: remote policy clients attach"
    )
    serve.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (loopback only)")
    serve.add_argument("--port", type=int, default=8765, help="the port to listen on")
    serve.add_argument("--runs-dir", default="service_runs", help="where runs are kept")
    serve.add_argument(
        "--token-file",
        help="a file holding the bearer token clients must send (default: GAP_TOKEN, else a "
        "new token written to a 0600 file whose path is printed)",
    )
    serve.add_argument(
        "--no-token", action="store_true", help="no token at all: anyone who reaches the port"
    )
    serve.add_argument(
        "--splits",
        help="YAML {val_train|val_unseen|test: {seeds: [...], task_ids, max_steps, template}}: "
        "the server's splits (what a run of one measures)",
    )
    serve.add_argument(
        "--config",
        help="the operator's own benchmark YAML, scheduled under --run-id before serving "
        "(trusted as a config file is; submissions are held to the remote profile)",
    )
    serve.add_argument("--run-id", type=_run_id, help="the run id of --config")
    _limit_options(serve)
    serve.set_defaults(func=_cmd_serve)
    _add_clients(subparsers)


def _add_clients(subparsers: argparse._SubParsersAction) -> None:
    """`gap submit`, `gap eval`, `gap status`: the client side of `gap serve`."""
    submit = subparsers.add_parser(
        "submit", help="schedule a config's trials on an evaluation server"
    )
    submit.add_argument("config", help="a benchmark YAML (modes: [policy_only], one policy)")
    submit.add_argument("--run-id", required=True, type=_run_id, help="a name for the run")
    submit.add_argument("--host", default="127.0.0.1", help="the evaluation server's host")
    submit.add_argument("--port", type=int, default=8765, help="the evaluation server's port")
    submit.add_argument(
        "--token-file",
        help="a file holding the service's bearer token (default: the GAP_TOKEN variable)",
    )
    submit.add_argument(
        "--json", action="store_true", help="print the answer, run secret included, as JSON"
    )
    submit.set_defaults(func=_cmd_submit)
    evaluate = subparsers.add_parser(
        "eval", help="attach a policy to a run on an evaluation server"
    )
    evaluate.add_argument("--url", required=True, help="the evaluation server, http://HOST:PORT")
    evaluate.add_argument(
        "--run-id", required=True, type=_run_id, help="the run to attach to (gap submit's)"
    )
    evaluate.add_argument(
        "--worker-ids", type=_worker_ids, default=[0], help="e.g. 0,1: one process each"
    )
    evaluate.add_argument("--policy", help="the model server the client asks, ws://HOST:PORT")
    evaluate.add_argument(
        "--policy-api-key-env",
        metavar="VARIABLE",
        help="the variable holding the key --policy wants (sent as Authorization: Api-Key)",
    )
    evaluate.add_argument(
        "--policy-header",
        action="append",
        metavar="NAME=VARIABLE",
        help="a header --policy wants, its value read from VARIABLE (repeatable)",
    )
    evaluate.add_argument(
        "--protocol",
        choices=["openpi", "vla-eval"],
        default="openpi",
        help="the protocol --policy speaks",
    )
    evaluate.add_argument(
        "--fake-actions",
        action="store_true",
        help="a connectivity smoke with a fixed action: one episode, never scored",
    )
    evaluate.add_argument(
        "--token-file",
        help="a file holding the service's bearer token (default: the GAP_TOKEN variable)",
    )
    evaluate.add_argument(
        "--run-secret-file",
        help="a file holding the run's secret (default: GAP_RUN_SECRET, else where gap submit "
        "wrote it on this machine)",
    )
    evaluate.set_defaults(func=_cmd_eval)
    status = subparsers.add_parser("status", help="where a run on an evaluation server stands")
    status.add_argument("--url", required=True, help="the evaluation server, http://HOST:PORT")
    status.add_argument("--run-id", required=True, type=_run_id, help="the run to report on")
    status.add_argument(
        "--token-file",
        help="a file holding the service's bearer token (default: the GAP_TOKEN variable)",
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_cmd_status)
