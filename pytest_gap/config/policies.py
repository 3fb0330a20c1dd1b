"""The `policies:` registry and `policy_manager:`: where each learned policy is served, and how.

An entry names exactly one source (a url, a command the session starts, or a preset), the
protocol and observation format its server speaks, its reply bounds, and where a managed server
runs under Ray. Registry keys name directories of the run (`<mode>/<policy id>/...`), so they
match the strict name pattern of pytest_gap/names.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    Field,
    field_validator,
    model_validator,
)

from pytest_gap.config.keys import SERVER_COMMAND, RemoteValue, ServerOnly, Strict
from pytest_gap.errors import one_line
from pytest_gap.names import check_name
from pytest_gap.policies.credentials import env_name_problem, header_name_problem

# Defined beside the policy client (the policy layer imports nothing of config); named here too.
from pytest_gap.policies.endpoint import (
    DEFAULT_MAX_REPLY_MB,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WARMUP_TIMEOUT_S,
    PROTOCOL_OBS_FORMATS,
    ObsFormatName,
)
from pytest_gap.redaction import redact_text

# Upper bounds of the counts and timeouts below: far above any use, finite (an infinite timeout
# or 10**9 restarts holds a session for ever on one typo).
MAX_CPUS = 1024.0
MAX_GPUS = 64.0
MAX_MEMORY_BYTES = 2**50  # a PiB
MAX_REPLY_S = 3600.0
MAX_WARMUP_S = 7200.0
MAX_REPLY_MB = 4096.0
MAX_STARTUP_S = 7200.0
MAX_GRACE_S = 600.0
MAX_RESTARTS = 10  # the k-th waits restart_backoff_s * 2**(k-1): the tenth, 512 backoffs
MAX_BACKOFF_S = 60.0


# A submission may not read the server's environment: a credential there is the operator's.
_CREDENTIAL = (
    "a credential read from the server's environment",
    "remove it: a remote policy is attached by gap eval, on the client's side",
)


def _bounded(high: float, *, gt: float | None = None, ge: float | None = None):
    """A finite number up to `high` (never inf or nan)."""
    return Field(gt=gt, ge=ge, le=high, allow_inf_nan=False)


def _no_ground_truth(value: Any) -> str | None:
    """A submitted policy entry may not ask for the simulator's ground truth: the relay would
    hand it to the client, whose policy then scores what no camera sees."""
    if value is not True:
        return None
    return (
        "true is not allowed in a submitted config (the server would send the client the "
        "simulator's ground truth: object poses, the goal); remove it"
    )


def _policy_id(value: str) -> str:
    return check_name(value, "policy id")


# A registry key is a directory of every trial of its policy (<mode>/<policy id>/...) and the
# name of its warm-up record: one strict name, in a file as in a submission.
PolicyId = Annotated[str, AfterValidator(_policy_id)]


class RayResources(Strict):
    """What each trial holds on a Ray cluster (`pytest --gap-ray`, pytest_gap/scale/): the
    resources of the long-lived actor that runs it, one actor per slot of a node. `memory` is
    bytes (Ray's unit); None reserves none."""

    # CPUs each actor holds.
    num_cpus: Annotated[float, _bounded(MAX_CPUS, ge=0)] = 1.0
    # GPUs (or a fraction) each actor holds; Ray sets its CUDA_VISIBLE_DEVICES.
    num_gpus: Annotated[float, _bounded(MAX_GPUS, ge=0)] = 0.0
    # Bytes of memory each actor reserves; None reserves none.
    memory: Annotated[int, Field(gt=0, le=MAX_MEMORY_BYTES)] | None = None

    @model_validator(mode="after")
    def _holds_something(self) -> RayResources:
        if not (self.num_cpus or self.num_gpus):
            raise ValueError(
                "num_cpus and num_gpus are both 0: a node would take any number of actors; "
                "give each trial num_cpus (e.g. 1) or num_gpus"
            )
        return self


class PolicyEntry(Strict):
    """One `policies:` registry entry: exactly one of url, command (alias start_cmd), preset.

    `obs_format` is what run_policy sends and how it reads replies (policies/formats.py); unset,
    it is `gap` for servers written for this harness over openpi's protocol (a `gap policy
    serve` command, or `privileged_state: true`) and otherwise the protocol's own LIBERO client
    format (openpi -> openpi-libero, vla-eval -> vla-eval-libero). See `resolved_obs_format`.
    """

    # An external server (ws://host:port): probed before any trial, never started.
    url: str | None = None
    # A server the session starts and stops: argv list or string with {port} (alias start_cmd).
    command: Annotated[
        list[str] | str | None, ServerOnly("a command the server would run", SERVER_COMMAND)
    ] = Field(default=None, validation_alias=AliasChoices("command", "start_cmd"))
    # A named openpi server (pi05-libero, pi0-libero, pi0-fast-libero) run in $GAP_OPENPI_DIR.
    preset: Annotated[
        str | None, ServerOnly("a policy server the server would start", SERVER_COMMAND)
    ] = None
    # Extra environment variables of a started server.
    env: Annotated[
        dict[str, str], ServerOnly("the environment of a command the server would run")
    ] = {}
    # The wire protocol the server speaks.
    protocol: Literal["openpi", "vla-eval"] = "openpi"
    # What observations are sent and how replies are read (see the entry's description).
    obs_format: ObsFormatName | None = None
    # Send simulator ground truth (oracle policies only; their rows are labelled [privileged]).
    privileged_state: Annotated[bool, RemoteValue(_no_ground_truth)] = False
    # Seconds a measured reply may take: a later one makes the trial an infrastructure failure,
    # never a stale action applied.
    timeout_s: Annotated[float, _bounded(MAX_REPLY_S, gt=0)] = DEFAULT_TIMEOUT_S
    # Seconds the one warm-up inference per process may take (openpi compiles its model on its
    # first call), charged to no trial; a later reply is an infrastructure failure of the trial.
    warmup_timeout_s: Annotated[float, _bounded(MAX_WARMUP_S, gt=0)] = DEFAULT_WARMUP_TIMEOUT_S
    # The largest frame its server may send us (policies/client.py); actions are kilobytes.
    max_reply_mb: Annotated[float, _bounded(MAX_REPLY_MB, gt=0)] = DEFAULT_MAX_REPLY_MB
    # The environment variable holding the key the server wants, sent as `Authorization:
    # Api-Key <value>` (openpi-client's form) over either protocol: its name, never the value.
    api_key_env: Annotated[str | None, ServerOnly(*_CREDENTIAL)] = None
    # Other headers the server wants, {header: the environment variable holding its value}.
    headers_env: Annotated[dict[str, str], ServerOnly(*_CREDENTIAL)] = {}
    # Under --gap-ray, a managed server runs in a Ray actor holding these resources, on a node
    # that has them (scale/ray_policy.py); without --gap-ray it runs here, as any other.
    ray: Annotated[RayResources | None, ServerOnly("where a server it starts would run")] = None

    @property
    def resolved_obs_format(self) -> ObsFormatName:
        if self.obs_format is not None:
            return self.obs_format
        # `gap policy serve --protocol vla-eval` is vla-eval's own server: it reads what
        # vla-eval's LIBERO benchmark sends, as any vla-eval model server does.
        native = self.privileged_state or _is_gap_policy_serve(self.command)
        if native and self.protocol == "openpi":
            return "gap"
        return PROTOCOL_OBS_FORMATS[self.protocol]

    @field_validator("api_key_env")
    @classmethod
    def _api_key_variable(cls, name: str | None) -> str | None:
        problem = env_name_problem(name) if name is not None else None
        if problem:
            raise ValueError(problem)
        return name

    @field_validator("headers_env")
    @classmethod
    def _header_variables(cls, headers: dict[str, str]) -> dict[str, str]:
        for header, name in headers.items():
            problem = header_name_problem(header) or env_name_problem(name)
            if problem:
                raise ValueError(f"{header}: {problem}")
        if "authorization" in {h.lower() for h in headers}:
            raise ValueError(
                "Authorization: give api_key_env for openpi's `Api-Key` form; a header of your "
                "own is fine under another name"
            )
        return headers

    @field_validator("url")
    @classmethod
    def _websocket_url(cls, url: str | None) -> str | None:
        if url is not None:
            problem = websocket_url_problem(url)
            if problem:
                raise ValueError(problem)
        return url

    @model_validator(mode="after")
    def _exactly_one_source(self) -> PolicyEntry:
        given = [k for k in ("url", "command", "preset") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of url, command (or start_cmd), preset"
                + (f"; got {', '.join(given)}" if given else "")
            )
        if self.url is not None and self.ray is not None:
            raise ValueError(
                "ray places a server the session starts (command or preset); a url: server "
                "runs wherever it was started: drop ray or give a command"
            )
        return self


def websocket_url_problem(url: str) -> str | None:
    """Why `url` is not a policy server's address (ws://HOST[:PORT][/PATH] or wss://), or None.
    Checked at load, so a typo is a config error and not a server that "does not answer"."""
    example = "e.g. ws://127.0.0.1:8000"
    shown = one_line(repr(redact_text(url)), 80)  # a url's password stays out of the message
    if not url or url != url.strip() or any(c.isspace() for c in url):
        return f"{shown} is not a URL (it is empty or has spaces); give the server's, {example}"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number in 0..65535
    except ValueError as exc:
        return f"{shown} is not a valid URL ({exc}); {example}"
    if parts.scheme.lower() not in ("ws", "wss"):
        return f"{shown} is not a ws:// or wss:// URL; policy servers speak websockets: {example}"
    if not parts.hostname:
        return f"{shown} has no host; {example}"
    if port == 0:
        return f"{shown}: port 0 is not a server's port; {example}"
    return None


def _is_gap_policy_serve(command: list[str] | str | None) -> bool:
    """Whether a managed command runs this harness's own server (`gap policy serve ...`)."""
    if command is None:
        return False
    try:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
    except ValueError:  # unbalanced quotes: the manager reports the command itself
        return False
    return len(argv) >= 3 and Path(argv[0]).name == "gap" and argv[1:3] == ["policy", "serve"]


class PolicyManagerConfig(Strict):
    """How the session starts, stops and restarts the policy servers it manages."""

    # Seconds a started server has to accept connections before the session fails.
    startup_timeout_s: Annotated[float, _bounded(MAX_STARTUP_S, ge=0)] = 120.0
    # Seconds between SIGTERM and SIGKILL when a server is stopped.
    evict_grace_s: Annotated[float, _bounded(MAX_GRACE_S, ge=0)] = 10.0
    # A managed server that dies mid-session is restarted at most max_restarts times (0: never),
    # the k-th restart after restart_backoff_s * 2**(k-1) s (pytest_gap/servers/supervisor.py).
    max_restarts: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = 3
    # the first restart's wait; doubles each time
    restart_backoff_s: Annotated[float, _bounded(MAX_BACKOFF_S, ge=0)] = 1.0
