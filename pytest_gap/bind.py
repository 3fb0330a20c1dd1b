"""Where a server listens. Every server of the harness (`gap policy serve`, `gap serve`,
`gap online serve`, the policy servers a session starts) binds to loopback unless told
otherwise; told otherwise, it says so in one line, since it then answers other machines too
(and a policy or evaluation server has no authentication of its own, or a bearer token only)."""

from __future__ import annotations

import ipaddress

LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it resolves to whatever the machine says
        return False


def exposure_notice(what: str, host: str) -> str | None:
    """One line for a server bound beyond loopback (None on loopback)."""
    if is_loopback(host):
        return None
    where = "every interface" if host in ("", "0.0.0.0", "::") else "an outside address"
    return (
        f"{what} listens on {host or '0.0.0.0'} ({where}), not only loopback: other machines "
        "can reach it; --host 127.0.0.1 keeps it local"
    )
