"""PolicyEndpoint: one policy server as a trial talks to it (registry -> runner -> skills)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

# The observation formats of policies/formats.py, by name (a registry entry's `obs_format:`).
ObsFormatName = Literal["openpi-libero", "vla-eval-libero", "gap"]
# A measured reply's limit by default: vla-eval's own (ServerConfig.timeout); openpi's client has
# none. The warm-up's is longer: openpi compiles its model on the first inference.
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_WARMUP_TIMEOUT_S = 300.0
# The largest frame a server may send us, MB: actions and metadata are kilobytes (client.py).
DEFAULT_MAX_REPLY_MB = 16
# A protocol's default observation format: what that protocol's own LIBERO client sends.
PROTOCOL_OBS_FORMATS: dict[str, ObsFormatName] = {
    "openpi": "openpi-libero",
    "vla-eval": "vla-eval-libero",
}


class PolicyEndpoint(BaseModel):
    """Where a registry entry's server listens and how run_policy talks to it.

    Built by `servers.registry.endpoints_for` from the entry and, for a managed server, the url
    the controller started it on. `obs_format` names a format of policies/formats.py; left out,
    it is the protocol's own (openpi -> openpi-libero, vla-eval -> vla-eval-libero).
    `privileged`: the server is an oracle that also receives ground truth. `timeout_s` bounds
    each measured reply (a later one closes the session: a stale chunk is never applied);
    `warmup_timeout_s` bounds the one warm-up inference per process (policies/warmup.py);
    `max_reply_mb` the largest frame its server may send (a larger one closes the session).
    `api_key_env` and `headers_env` name the variables holding its credentials (never the
    values: policies/credentials.py), read by each process as it connects.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    protocol: Literal["openpi", "vla-eval"] = "openpi"
    obs_format: ObsFormatName
    privileged: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    warmup_timeout_s: float = DEFAULT_WARMUP_TIMEOUT_S
    max_reply_mb: float = DEFAULT_MAX_REPLY_MB
    policy_id: str = ""  # the registry entry's id: what a missing credential's message names
    api_key_env: str | None = None
    headers_env: dict[str, str] = {}

    @property
    def client_options(self) -> dict[str, Any]:
        """What connect_policy takes from the endpoint besides url, protocol and timeout: the
        credentials' values read from this process's environment now."""
        from pytest_gap.policies.credentials import credential_headers

        where = f"policies.{self.policy_id or '<id>'}"
        headers = credential_headers(where, self.api_key_env, self.headers_env)
        return {"max_reply_bytes": round(self.max_reply_mb * 2**20), "headers": headers}

    @model_validator(mode="before")
    @classmethod
    def _protocol_default_format(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("obs_format") is None:
            default = PROTOCOL_OBS_FORMATS.get(data.get("protocol", "openpi"))
            data = {**data, "obs_format": default}
        return data
