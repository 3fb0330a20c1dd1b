"""What every door of the harness checks, and what it hands to the processes it starts.

- Browsers: every server (`gap serve`, `gap policy serve` in both protocols, the relays of
  `gap serve`, `gap online serve`) refuses a request a browser made. A web page the operator
  has open could otherwise drive a loopback server: a websocket handshake needs no CORS
  consent, and a page can rebind its own host name to 127.0.0.1. Browsers mark what they
  send: `Origin` on every websocket handshake and cross-site request, `Sec-Fetch-Site` on every
  request of a current browser. The clients the harness serves (openpi-client, vla-eval's
  Connection, ours) send neither, so the rule costs them nothing (websocket-client adds an
  Origin unless told not to).
- Secrets (bearer tokens, run secrets, relay tokens) are compared in constant time on bytes:
  `==` stops at the first differing character, and `secrets.compare_digest` on str raises on a
  non-ASCII value (a crafted header would be a 500, not a 401).
- Secret files are 0600 in a 0700 directory of the user's (`$XDG_STATE_HOME/pytest-gap`,
  default `~/.local/state/pytest-gap`), written whole or not at all; never under a runs dir.
- Children get an allow-list of this process's environment (`child_env`), by name where a
  prefix would let an operator's own settings through, and proxy urls without their
  `user:password@`: a policy server or a task server never sees an operator's API keys, proxy
  login or other `GAP_*` / `XDG_*` variables.

Not defended: anyone running as the same uid (they read the files, /proc/PID/environ and the
process's memory); tenants who must not see each other need their own uids.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import stat
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path

from pytest_gap.bind import LOOPBACK, is_loopback
from pytest_gap.errors import GapError
from pytest_gap.redaction import is_secret_name

STATE_DIR_NAME = "pytest-gap"
BROWSER_HEADERS = ("Origin", "Sec-Fetch-Site")
# the variables programs take a proxy from, in the spellings they read (curl, requests, urllib,
# pip, huggingface_hub: lower case first, then upper)
PROXY_NAMES = frozenset(
    f"{scheme}_proxy".upper() if upper else f"{scheme}_proxy"
    for scheme in ("http", "https", "all", "ftp", "no")
    for upper in (False, True)
)


# -- browsers ------------------------------------------------------------------------------------
def header_values(headers, name: str) -> list[str]:
    """Every value of header `name`: websockets' Headers and http.server's message alike (their
    `get` raises, or keeps one, when a crafted request repeats a header)."""
    values = headers.get_all(name)
    return list(values or [])


def browser_refusal(headers) -> str | None:
    """One line when the request carries a browser's marks (None for a program's request)."""
    for name in BROWSER_HEADERS:
        values = header_values(headers, name)
        if values:
            shown = values[0] if len(values[0]) <= 80 else values[0][:77] + "..."
            return (
                f"refused a browser's request ({name}: {shown}): this server answers programs, "
                f"never a web page (a client library that adds {name} by itself: turn it off, "
                "e.g. websocket-client's suppress_origin=True)"
            )
    return None


def refuse_browsers(connection, request):
    """A websockets `process_request` step: 403 for a browser's request, else None (go on)."""
    why = browser_refusal(request.headers)
    return None if why is None else connection.respond(HTTPStatus.FORBIDDEN, why + "\n")


# -- secrets -------------------------------------------------------------------------------------
def new_secret() -> str:
    """256 random bits, URL-safe: a bearer token, a run secret, a relay token."""
    return secrets.token_urlsafe(32)


def same_secret(given: str | bytes | None, expected: str | bytes) -> bool:
    """Constant-time equality of two secrets, on their bytes (None: never equal)."""
    if given is None:
        return False
    return hmac.compare_digest(_bytes(given), _bytes(expected))


def _bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value


def bearer(headers) -> str | None:
    """The token of the request's one `Authorization: Bearer TOKEN` header (None without one,
    or with several: a request that says two things is refused, not read either way)."""
    values = header_values(headers, "Authorization")
    if len(values) != 1 or not values[0].startswith("Bearer "):
        return None
    return values[0][len("Bearer ") :]


# -- secret files --------------------------------------------------------------------------------
def state_dir() -> Path:
    """This user's directory for the harness's secrets (created 0700 when written to)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / STATE_DIR_NAME


def server_token_path(port: int) -> Path:
    """Where `gap serve` on `port` writes the token it made, and local clients look for it."""
    return state_dir() / f"serve-{port}.token"


def run_secret_path(host: str, port: int, run_id: str) -> Path:
    """Where `gap submit` keeps a run's secret: by the server as its clients name it (every
    loopback name is one server) and the run id (already a file-safe name)."""
    where = LOOPBACK if is_loopback(host) else re.sub(r"[^A-Za-z0-9.-]", "_", host)
    return state_dir() / "runs" / f"{where}_{port}" / f"{run_id}.secret"


def _private_dirs(directory: Path) -> None:
    """`directory` and the state directory's part of its parents: this user's, mode 0700."""
    root = state_dir()
    root.parent.mkdir(parents=True, exist_ok=True)
    chain = [d for d in (directory, *directory.parents) if d == root or root in d.parents]
    if not chain:
        directory.mkdir(parents=True, exist_ok=True)
    for path in reversed(chain):
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise GapError(f"{path}: not a directory of this user's; remove it and run again")
        if info.st_mode & 0o077:
            path.chmod(0o700)


def write_secret(path: Path, value: str) -> Path:
    """Write `value` to `path`, mode 0600 from its first byte, replacing any file there."""
    _private_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(value + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_secret(path: Path, what: str) -> str:
    """The secret in `path`; a one-line GapError naming `what` (e.g. `--token-file F`) when it
    cannot be read or is empty."""
    try:
        value = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise GapError(f"{what}: cannot read it: {why}") from None
    if not value:
        raise GapError(f"{what}: the file is empty; put the secret in it")
    return value


def remove_secret(path: Path, value: str) -> None:
    """Remove `path` if it still holds `value` (a newer server's file is left alone)."""
    try:
        if same_secret(path.read_text().strip(), value):
            path.unlink()
    except OSError:
        pass


def take_env(name: str) -> str | None:
    """The variable's value, removed from this process's environment as it is read: a secret
    in the environment would otherwise reach every process started from here."""
    return os.environ.pop(name, None) or None


# -- children ------------------------------------------------------------------------------------
# What a server the harness starts may need of its environment: where programs, libraries,
# modules and caches are; the locale; the display, GL and GPU selection; proxies to fetch
# checkpoints through (their credentials stripped: `proxy_without_credentials`); the harness's
# own settings, each by name. A registry entry's `env:` adds the rest. Names are listed, not
# prefixes, where a prefix is shared with what a child must not see: `GAP_*` holds an operator's
# own names too (a GAP_DB_URL), `XDG_*` a desktop session's.
# The harness's settings a task server, a trial or a Ray actor reads (sim/pool.py,
# sim/scene_cache.py, run/devices.py, outputs/plots.py, producers/chat.py). By name: the rest of
# `GAP_*` is the operator's (a GAP_DB_URL) or a secret (GAP_TOKEN).
HARNESS_SETTINGS = frozenset(
    {
        "GAP_ENV_POOL_SIZE",
        "GAP_SCENE_CACHE",
        "GAP_SCENE_CACHE_MB",
        "GAP_MUJOCO_EGL_DEVICES",
        "GAP_NO_PLOTS",
        "GAP_LLM_CACHE_DIR",
    }
)
# The test suite's own settings (its tripwires, tests/sim_guard, and the faults its fake
# backend injects), which must reach every process its servers and clusters start; one prefix
# no operator's setting shares.
TEST_SETTINGS_PREFIX = "GAP_TEST_"


def is_harness_setting(name: str) -> bool:
    return name in HARNESS_SETTINGS or name.startswith(TEST_SETTINGS_PREFIX)


CHILD_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "TZ",
        "TMPDIR",
        "LANG",
        "LANGUAGE",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "DISPLAY",
        "XAUTHORITY",
        "WAYLAND_DISPLAY",
        "MUJOCO_GL",
        "PYOPENGL_PLATFORM",
        "MUJOCO_EGL_DEVICE_ID",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_HOME",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "PYTORCH_CUDA_ALLOC_CONF",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "TORCH_HOME",
        "OPENPI_DATA_HOME",
        "UV_CACHE_DIR",
        # the base directories: the harness's state (secrets dir) and caches, a model
        # library's cache and config, the runtime dir a Wayland or EGL display lives in
        "XDG_STATE_HOME",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "XDG_RUNTIME_DIR",
        *HARNESS_SETTINGS,
        *PROXY_NAMES,
    }
)
CHILD_ENV_PREFIXES = (
    TEST_SETTINGS_PREFIX,
    "LC_",
    "EGL_",
    "__EGL_",
    "__GLX_",
    "MESA_",
    "LIBGL_",
    "GALLIUM_",
    "XLA_",
    "JAX_",
)
# `[scheme://]userinfo@` at the start of a proxy url: up to the last `@`, whatever the userinfo
# holds (an unencoded `/` or `#` in a password included)
_PROXY_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?[^@]*@")


def holds_secret(name: str) -> bool:
    """A variable whose name says it holds a secret (GAP_TOKEN, OPENAI_API_KEY) or headers (an
    Authorization value): it never passes to another process, whatever its prefix."""
    return is_secret_name(name) or "HEADER" in name.upper()


def _passes(name: str) -> bool:
    allowed = name in CHILD_ENV_NAMES or name.startswith(CHILD_ENV_PREFIXES)
    return allowed and not holds_secret(name)


def proxy_without_credentials(value: str) -> str:
    """A proxy url with its `user:password@` taken out (`http://u:p@proxy:3128` ->
    `http://proxy:3128`): the child still goes through the proxy, and a proxy that wants a
    login is given one by the entry's `env:`, not by the operator's shell."""
    return _PROXY_USERINFO.sub(lambda m: m.group(1) or "", value.strip(), count=1)


def child_env(
    extra: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a process the harness starts: the allow-listed part of `environ`
    (this process's by default), proxy urls without their credentials, then `extra` (an
    entry's `env:`, a token it is given) as it is."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if _passes(k)}
    for name in PROXY_NAMES & env.keys():
        env[name] = proxy_without_credentials(env[name])
    env.update(extra or {})
    return env
