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


def outside_address() -> str | None:
    """This machine's address on its default route (None without one, or if it is loopback):
    where another machine would reach a server bound to every interface."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1; a UDP connect sends nothing
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if is_loopback(address) else address


def reachable_beyond_loopback(port: int, timeout_s: float = 0.5) -> str | None:
    """The outside address on which `port` accepts a connection (a server bound beyond
    loopback), or None. For servers the harness starts but does not bind itself (a managed
    policy command: openpi's serve_policy.py binds 0.0.0.0 and has no option for it)."""
    import socket

    address = outside_address()
    if address is None:
        return None
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return address
    except OSError:
        return None
