"""Before any trial, on the controller: check the services a session's cells need.

Two kinds of trouble, two outcomes (the spec's exit codes):
- a problem only the user can fix (the LLM provider refuses the key or does not know the model;
  a managed policy's program does not exist, an unknown preset) is a config error: it is
  raised, the session stops before any trial (pytest exit status 4, `gap benchmark` 2) with one
  line naming what to fix;
- a service that is down (an LLM endpoint unreachable or failing after retries; a policy server
  that does not start or does not answer its handshake) is an infrastructure failure: every cell
  that needs it is errored (its trials are recorded as infrastructure failures without running),
  the rest of the grid runs, the gate fails (exit 1).
What is down ({config path: {"llm" | "policies": why}}) is handed to every xdist worker by the
plugin (xdist's workerinput, with the urls of the started servers), so that every process plans
the same errored cells.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pytest_gap.cells import Cell
from pytest_gap.config.document import BenchmarkConfig
from pytest_gap.errors import GapError, InfraFailure
from pytest_gap.redaction import redact_text

# (config file, config, cells that will run, policy server log dir)
Planned = tuple[Path, BenchmarkConfig, list[Cell], Path]


def check_llms(configs: list[Planned], **settings_update) -> dict:
    """One 1-token request per distinct LLM the cells need; raises LLMConfigError.

    Returns {config path: {"llm": why}} for the LLMs that are down. `settings_update` changes
    the client's settings (max_retries, timeout_s) for a quicker look.
    """
    from pytest_gap.producers.chat import ChatClient, resolve_settings

    down: dict[str, dict[str, str]] = {}
    checked: dict[str, str | None] = {}
    for path, config, cells, _ in configs:
        if not any(cell.needs_llm for cell in cells):
            continue
        settings = resolve_settings(config.llm, str(path)).model_copy(update=settings_update)
        key = hashlib.sha256(
            json.dumps([settings.base_url, settings.model, settings.api_key]).encode()
        ).hexdigest()
        if key not in checked:
            try:
                ChatClient(settings).check()
                checked[key] = None
            except InfraFailure as exc:
                checked[key] = redact_text(f"the LLM did not answer the preflight request: {exc}")
        if checked[key]:
            down.setdefault(str(path), {})["llm"] = checked[key]
    return down


def start_policies(configs: list[Planned], launcher=None):
    """Probe the external policy servers and start the managed ones the cells need
    (`launcher`: where entries it places start, servers/manager.py `Launcher`).

    Returns (SessionPolicies or None, {config path: {"policies": why}}); raises
    PolicyConfigError for a command or preset that cannot work as written.
    """
    from pytest_gap.servers.manager import PolicyConfigError
    from pytest_gap.servers.registry import SessionPolicies

    users = [
        c
        for c in configs
        if any((cell.policy_id or cell.workflow_policies) and not cell.error for cell in c[2])
    ]
    if not users:
        return None, {}
    policies = SessionPolicies()
    try:
        policies.start(
            [(config, cells, log_dir) for _, config, cells, log_dir in users], launcher=launcher
        )
    except PolicyConfigError:
        raise
    except GapError as exc:  # one failure stops every server of the session
        why = redact_text(f"the policy servers were not started: {exc}")  # url passwords
        return policies, {str(path): {"policies": why} for path, *_ in users}
    return policies, {}


def check_config(
    path: Path, config: BenchmarkConfig, cells: list[Cell], on_ray: bool = False
) -> None:
    """The config problems a preflight would find, found without starting anything heavy:
    raises PolicyConfigError or LLMConfigError. Services that are down are left to the session.
    `gap benchmark` calls it before it starts the pytest session, for a one-line error.
    `on_ray`: entries with `ray:` start on a cluster node, whose programs are checked there."""
    from pytest_gap.servers.manager import check_command
    from pytest_gap.servers.registry import check_credentials, needed

    entries = needed(config, cells)
    check_credentials(path, entries)
    for policy_id, entry in entries.items():
        if entry.url is None and not (on_ray and entry.ray is not None):
            check_command(policy_id, entry)
    check_llms([(path, config, cells, path.parent)], max_retries=0, timeout_s=30.0)
