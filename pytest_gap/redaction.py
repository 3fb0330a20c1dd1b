"""Mask secrets in what the harness writes about a run (manifests, summaries, errors).

A value is secret when its name says so (a word of it is, or ends in, key, token, secret,
password, auth, credential, signature, or is sig: `--api-key`, `OPENAI_API_KEY=`, `hf_token`,
`Authorization`, a signed url's `X-Amz-Signature=` or `sig=`) or by its form
(`Authorization: ...`, `Bearer ...`, `Api-Key ...`, a url's `user:password@`, a url query
parameter with a secret name). The value becomes `***`; the name stays, so the record
still says which setting was given. Pure functions; nothing is logged.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

MASK = "***"
_SECRET_WORDS = (
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "auth",
    "credential",
    "signature",
    "sig",  # Azure's shared access signature
)
_SECRET_ENDINGS = ("key", "token", "secret", "password", "auth", "credentials", "signature")
_AUTH_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization\s*[:=]\s*)(?:(bearer|basic|api-key|token)\s+)?[^\s,;'\"]+"
)
_SCHEME_TOKEN = re.compile(r"(?i)\b(bearer|api-key)(\s+)[A-Za-z0-9._~+/=-]+")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*):[^/\s@]+@")
_NAME_VALUE = re.compile(r"(?<![\w-])(-{0,2}[A-Za-z_][\w.-]*)(=)([^\s&#]+)")


def is_secret_name(name: str) -> bool:
    """`--api-key`, `OPENAI_API_KEY`, `hf_token`, `Authorization`: yes; `--keyword`: no."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)


def redact_text(text: str) -> str:
    """Mask header values, bearer tokens, url passwords and `secret_name=value` in a string."""
    text = _AUTH_HEADER.sub(
        lambda m: m.group(1) + (f"{m.group(2)} " if m.group(2) else "") + MASK, text
    )
    text = _SCHEME_TOKEN.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}:{MASK}@", text)
    return _NAME_VALUE.sub(
        lambda m: (
            m.group(1) + m.group(2) + MASK
            if is_secret_name(m.group(1)) and m.group(3) != MASK
            else m.group(0)
        ),
        text,
    )


def redact_values(text: str, values) -> str:
    """`text` with each of `values` (secrets known by value: a credential read from the
    environment) masked, then `redact_text`'s forms."""
    for value in sorted((v for v in values if v), key=len, reverse=True):
        text = text.replace(value, MASK)
    return redact_text(text)


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with secret option values masked: `--api-key VALUE`, `--api-key=VALUE`,
    `NAME=VALUE` (an environment assignment or a `-o` ini override), headers, urls."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next and not arg.startswith("-"):
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        name, eq, _ = arg.partition("=")
        if arg.startswith("-") and not eq and is_secret_name(name):
            mask_next = True  # the value is the next argument
            out.append(arg)
        else:
            out.append(redact_text(arg))
    return out


def redact_command(command: str | list[str]) -> str | list[str]:
    """A registry command (argv list or shell-style string) with its secrets masked."""
    if isinstance(command, list):
        return redact_argv([str(part) for part in command])
    try:
        return " ".join(redact_argv(shlex.split(command)))
    except ValueError:  # unbalanced quotes: mask what the text shows
        return redact_text(command)


def redact_tree(data: Any) -> Any:
    """JSON-like data with secrets masked: values under secret names, commands, strings."""
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            if is_secret_name(str(key)) and isinstance(value, str | int | float) and value != "":
                out[key] = MASK
            elif key in ("command", "start_cmd", "argv") and isinstance(value, str | list):
                out[key] = redact_command(value)
            else:
                out[key] = redact_tree(value)
        return out
    if isinstance(data, list | tuple):
        return [redact_tree(value) for value in data]
    if isinstance(data, str):
        return redact_text(data)
    return data
