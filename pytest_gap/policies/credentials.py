"""Credentials a policy server wants: named in the registry, read from the environment.

A registry entry names the *variables* that hold them, never the values
(`policies.<id>.api_key_env`, sent as openpi-client's `Authorization: Api-Key <value>`;
`policies.<id>.headers_env`, {header: variable} for any other header), for either protocol.
Only the names travel: in the config, the run dir's copy of it, the endpoint each worker gets.
Each process that connects reads the values from its own environment at connect time (xdist
workers inherit the session's), so no record, log or message holds one; a client's error text
is redacted of them all the same (the server's refusal could echo a header). A submitted config
may not name any (config/policies.py: the server's environment is not a submitter's to read).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from pytest_gap.errors import InfraFailure

API_KEY_HEADER = "Authorization"
API_KEY_SCHEME = "Api-Key"  # openpi-client's WebsocketClientPolicy(api_key=) sends this
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
# Headers the websocket handshake itself sets: a registry entry may not replace them.
HANDSHAKE_HEADERS = frozenset(
    {"host", "upgrade", "connection", "origin", "user-agent"}
) | frozenset(f"sec-websocket-{h}" for h in ("key", "version", "extensions", "protocol"))


class MissingCredential(InfraFailure):
    """A variable a registry entry names is not set in the process that connects: the session
    checks its own before any trial (servers/registry.py), so a worker without it (a node
    started elsewhere) is the infrastructure's failure, never the policy's."""


def header_name_problem(name: str) -> str | None:
    if not HEADER_NAME.fullmatch(name):
        return f"{name!r} is not a header name (letters, digits and '-', at most 64)"
    if name.lower() in HANDSHAKE_HEADERS:
        return f"{name} is set by the websocket handshake itself; name another header"
    return None


def env_name_problem(name: str) -> str | None:
    if not ENV_NAME.fullmatch(name):  # not shown: it may be the very secret, written in
        return (
            "not an environment variable's name (letters, digits, '_'): name the variable "
            "that holds the value, never the value"
        )
    return None


def unset(where: str, api_key_env: str | None, headers_env: Mapping[str, str]) -> list[str]:
    """One line per variable `where` (`policies.<id>`) names that this environment lacks."""
    named = [(f"{where}.api_key_env", api_key_env)] if api_key_env else []
    named += [(f"{where}.headers_env.{h}", v) for h, v in headers_env.items()]
    return [
        f"{key}: the variable {var} is not set where the session runs; export it (its value is "
        "what the server wants) or remove the key"
        for key, var in named
        if not os.environ.get(var)
    ]


def credential_headers(
    where: str, api_key_env: str | None, headers_env: Mapping[str, str]
) -> dict[str, str]:
    """The headers to send, their values read from the environment now; MissingCredential
    (naming each key and variable) if one is not set."""
    missing = unset(where, api_key_env, headers_env)
    if missing:
        raise MissingCredential("; ".join(missing))
    headers = {h: os.environ[v] for h, v in headers_env.items()}
    if api_key_env:
        headers[API_KEY_HEADER] = f"{API_KEY_SCHEME} {os.environ[api_key_env]}"
    return headers
