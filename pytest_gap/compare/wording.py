"""How the comparison's messages name digests, counts and lists: short, so that one refusal or
note stays one line."""

from __future__ import annotations

from collections.abc import Sequence


def short_digest(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def count_pairs(n: int) -> str:
    return f"{n} pair" if n == 1 else f"{n} pairs"


def first_few(items: Sequence[str], n: int = 3) -> str:
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(items[:n]) + more
