"""What several command groups read: positive numbers as argument types, the bearer token
(from a file or the environment, never from the command line), and the servers' log."""

from __future__ import annotations

import argparse
import logging


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return value


def bearer_token(args: argparse.Namespace) -> str | None:
    """The bearer token from --token-file, else the GAP_TOKEN environment variable (never a
    command-line value: it would show in `ps`). GAP_TOKEN leaves the environment as it is read,
    whichever is used: no process started from here inherits it."""
    from pathlib import Path

    from pytest_gap.doors import read_secret, take_env
    from pytest_gap.service.protocol import TOKEN_ENV

    from_env = take_env(TOKEN_ENV)
    if not getattr(args, "token_file", None):
        return from_env
    return read_secret(Path(args.token_file), f"--token-file {args.token_file}")


def log_to_stderr(name: str) -> None:
    """A server command's log: INFO and up to stderr, each line `NAME: message`, the message
    escaped (errors.EscapedLogFormatter: a peer's text cannot forge or clear log lines)."""
    from pytest_gap.errors import EscapedLogFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(EscapedLogFormatter(f"{name}: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
