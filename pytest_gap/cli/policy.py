"""`gap policy serve`: serve a learned policy (built-in, an import string or a config's entry)
over openpi's websocket protocol or vla-eval's.

Each command imports what it runs when it runs (see the package's docstring: the parser stays
light).
"""

from __future__ import annotations

import argparse
import contextlib

from pytest_gap.cli.common import positive_float, positive_int
from pytest_gap.errors import GapError

MAX_MESSAGE_MB = 64.0  # server.DEFAULT_MAX_MESSAGE_MB (not imported: parsing stays light)


def _cmd_policy_serve(args: argparse.Namespace) -> int:
    if args.config:
        return _exec_policy_entry(args)
    policy, metadata = _policy(args)
    if (args.protocol or "openpi") == "vla-eval":
        return _serve_vla_eval(policy, args)
    from pytest_gap.policies.server import PolicyServer

    server = PolicyServer(
        policy,
        host=args.host,
        port=args.port,
        metadata=metadata,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_message_bytes=round(args.max_message_mb * 2**20),
        debug=args.debug,
    )
    with contextlib.suppress(KeyboardInterrupt):
        server.run(_announcer(args))
    return 0


def _policy(args: argparse.Namespace):
    """The policy NAME names, and the metadata its server announces: a torch checkpoint's
    announces its class and the file's digest (policies/torch_policy.py)."""
    from pytest_gap.policies.builtin import load_policy

    if args.name != "torch":
        for flag, given in (("--checkpoint", args.checkpoint), ("--threads", args.threads)):
            if given is not None:
                raise GapError(f"{flag} is for `gap policy serve torch` only, not {args.name!r}")
        policy = load_policy(args.name, actions=args.actions, chunk=args.chunk)
        return policy, {"policy": args.name}
    if args.checkpoint is None:
        raise GapError("gap policy serve torch needs --checkpoint FILE (save_checkpoint's file)")
    from pytest_gap.policies.torch_policy import load_checkpoint, set_threads

    if args.threads is not None:
        set_threads(args.threads)
    policy = load_checkpoint(args.checkpoint, device=args.device)
    return policy, policy.metadata


def _announcer(args: argparse.Namespace, suffix: str = ""):
    """What a server calls once its port is bound: the "serving" line a reader waits for."""

    def listening(port: int) -> None:
        print(f"serving {args.name} on ws://{args.host}:{port}{suffix}", flush=True)

    return listening


def _exec_policy_entry(args: argparse.Namespace) -> int:
    """Replace this process with the command of the --config entry NAME."""
    import os

    from pytest_gap.config.document import load_config
    from pytest_gap.doors import child_env
    from pytest_gap.servers.manager import command_for

    own = {"--protocol": args.protocol, "--actions": args.actions, "--chunk": args.chunk}
    given = [flag for flag, value in own.items() if value is not None]
    if given:
        raise GapError(
            f"{', '.join(given)}: a --config entry is served by its own command; give such "
            "options in that command"
        )
    entries = load_config(args.config).policies
    if args.name not in entries:
        known = ", ".join(entries) or "none"
        raise GapError(f"{args.config}: policies has no entry {args.name!r} (it has {known})")
    entry = entries[args.name]
    if entry.url is not None:
        raise GapError(
            f"{args.config}: policies.{args.name} is external (url: {entry.url}); start "
            "that server where it lives"
        )
    argv, cwd = command_for(args.name, entry, args.port)
    print(f"serving {args.name}: {' '.join(argv)}", flush=True)
    if cwd is not None:
        os.chdir(cwd)
    # The environment a session gives this entry's server (doors.child_env): by hand or
    # managed, the server sees the same variables.
    os.execvpe(argv[0], argv, child_env(entry.env))


def _serve_vla_eval(policy, args: argparse.Namespace) -> int:
    """Serve over vla-eval's protocol with vla-eval's own server; the openpi server's options
    it has no counterpart for are refused rather than ignored."""
    from pytest_gap.policies.vla_eval_server import model_server, serve

    unsupported = [
        flag
        for flag, given in (
            ("--max-message-mb", args.max_message_mb != MAX_MESSAGE_MB),
            ("--debug", args.debug),
        )
        if given
    ]
    if unsupported:
        raise GapError(
            f"{', '.join(unsupported)}: for --protocol openpi only; vla-eval's own server has "
            "no such option (drop it, or serve with --protocol openpi)"
        )
    # refuses a policy vla-eval cannot serve, or cannot batch when batching is asked for
    server = model_server(policy, args.name, args.max_batch_size, args.max_wait_ms)
    with contextlib.suppress(KeyboardInterrupt):
        serve(server, args.host, args.port, _announcer(args, " (vla-eval protocol)"))
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    """`gap policy` and its subcommand `serve`."""
    policy = subparsers.add_parser("policy", help="learned policies")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    serve = policy_sub.add_parser(
        "serve",
        help="serve a policy over openpi's websocket protocol (GET /healthz: 200) or "
        "vla-eval's (GET /health: 200)",
    )
    serve.add_argument(
        "name",
        help="built-in (hold, random, scripted, replay), torch (with --checkpoint), "
        "module:Class with infer(obs), or a --config entry",
    )
    serve.add_argument("--config", help="benchmark YAML whose policies: entry NAME to serve")
    serve.add_argument("--port", type=int, required=True, help="the port to listen on")
    serve.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: loopback only)"
    )
    serve.add_argument(
        "--protocol",
        choices=("openpi", "vla-eval"),
        help="openpi (default): each connection is one episode; vla-eval: vla-eval's own server, "
        "one action per observation, EPISODE_START starts afresh (scripted is refused: no "
        "vla-eval benchmark sends its privileged state)",
    )
    serve.add_argument(
        "--actions",
        metavar="FILE",
        help="replay: the actions to replay, a .npy float array (N, 7) or a .json "
        '{"actions": [[7 numbers], ...]}; every episode starts at the first, and after the last '
        "the arm holds still (zero motion, the last action's gripper command)",
    )
    serve.add_argument(
        "--chunk",
        type=positive_int,
        metavar="N",
        help="replay: actions per reply over openpi (default 5); an exact replay needs N equal "
        "to the client's replan_every (run_policy's and openpi's LIBERO client's default: 5)",
    )
    serve.add_argument(
        "--max-batch-size",
        type=int,
        default=1,
        help="batch observations across connections (needs the policy's infer_batch); over "
        "vla-eval's protocol, its PredictModelServer's own batching",
    )
    serve.add_argument("--max-wait-ms", type=float, default=5.0, help="batch collection window")
    serve.add_argument(
        "--max-message-mb",
        type=positive_float,
        default=MAX_MESSAGE_MB,
        help="refuse incoming messages over this size (MiB; default 64), with close code 1009",
    )
    serve.add_argument(
        "--checkpoint",
        metavar="FILE",
        help="torch: the checkpoint to serve (pytest_gap.policies.torch_policy.save_checkpoint)",
    )
    serve.add_argument("--device", default="cpu", help="torch: where it runs (cpu, cuda:0, ...)")
    serve.add_argument(
        "--threads", type=positive_int, help="torch: CPU threads for inference (default: torch's)"
    )
    serve.add_argument(
        "--debug",
        action="store_true",
        help="send the traceback on a failure (default: one line, the exception and message)",
    )
    serve.set_defaults(func=_cmd_policy_serve)
