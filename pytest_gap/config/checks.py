"""Checks pydantic cannot express: against the backend's catalogue, the mode table, the shipped
templates, the policies registry and the file system.

They read the raw YAML data (defensively), so they are reported together with the structural
errors of the models instead of only after those are fixed.
"""

from __future__ import annotations

import difflib
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pytest_gap.errors import GapError
from pytest_gap.modes import BUILTIN, ModeTable
from pytest_gap.producers.templates import template_names, unknown_template
from pytest_gap.sim import backend as sim


def semantic_problems(data: dict, base: Path, mode_table: ModeTable = BUILTIN) -> list[str]:
    problems: list[str] = []
    backend = _backend(data, problems)
    policies = data.get("policies") if isinstance(data.get("policies"), dict) else {}
    block = data.get("benchmark")
    if isinstance(block, dict):
        families = (
            {name: f.variations() for name, f in backend.families().items()} if backend else None
        )
        problems += _grid_problems(block, policies, families, base, mode_table)
        if data.get("suites"):
            problems.append(
                "suites: a grid config (with a benchmark: block) does not use a suites: list; "
                "remove one of them"
            )
    suites = data.get("suites")
    for i, entry in enumerate(suites if isinstance(suites, list) else []):
        if isinstance(entry, dict):
            problems += _suite_problems(f"suites.{i}", entry, base, backend)
    if data.get("split") is not None:
        problems.append(
            "split: only a config submitted to an evaluation server with splits (gap serve "
            "--splits) names one, and the server decides its seeds and tasks; here, remove it "
            "and set benchmark.seeds and benchmark.task_ids"
        )
    return problems + _gate_problems(data)


def _gate_problems(data: dict) -> list[str]:
    """One rule decides when a cell stops: a baseline, an A/B `compare:` or `gate_rule:
    sequential`; and an A/B test names two policies of a grid's policy axis."""
    block = data.get("benchmark")
    where = "benchmark.gate_rule" if isinstance(block, dict) else "gate_rule"
    rule = (block if isinstance(block, dict) else data).get("gate_rule")
    gate, compare = data.get("gate"), data.get("compare")
    deciders = [where] if rule == "sequential" else []
    deciders += ["gate.baseline"] if isinstance(gate, dict) and gate.get("baseline") else []
    deciders += ["compare"] if isinstance(compare, dict) else []
    problems = []
    if len(deciders) > 1:
        problems.append(
            f"{deciders[1]}: {' and '.join(deciders)} each decide when a cell stops; keep one "
            "of them"
        )
    if isinstance(compare, dict):
        problems += _compare_problems(compare, block)
    return problems


def _compare_problems(compare: dict, block: Any) -> list[str]:
    if not isinstance(block, dict):
        return ["compare: an A/B test pairs two policies of a grid; give a benchmark: block"]
    axis = block.get("policies") if isinstance(block.get("policies"), list) else []
    problems = []
    for side in ("a", "b"):
        if compare.get(side) is not None and compare[side] not in axis:
            problems.append(
                f"compare.{side}: {compare[side]!r} is not in benchmark.policies "
                f"({', '.join(map(str, axis)) or 'none'}); list it there"
            )
    if compare.get("a") is not None and compare.get("a") == compare.get("b"):
        problems.append("compare.b: the same policy as compare.a; name two policies")
    return problems


def _backend(data: dict, problems: list[str]):
    """The config's simulator backend (families and suites are checked against its
    catalogue), or None after adding why it cannot be had to `problems`."""
    key = "backend"
    if isinstance(data.get("benchmark"), dict):
        if "backend" in data:
            problems.append(
                "backend: a grid config names its simulator in benchmark.backend; move it there"
            )
        key, name = "benchmark.backend", data["benchmark"].get("backend", sim.DEFAULT_BACKEND)
    else:
        name = data.get("backend", sim.DEFAULT_BACKEND)
    if not isinstance(name, str):
        return None  # pydantic reports the type
    try:
        return sim.get_backend(name)
    except GapError as exc:
        problems.append(f"{key}: {exc}")
        return None


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _unknown(key: str, what: str, value: str, known) -> str:
    known = list(known)
    close = difflib.get_close_matches(value, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(known)}"
    return f"{key}: unknown {what} {value!r}; {hint}"


def _grid_problems(
    block: dict, policies: dict, families, base: Path, mode_table: ModeTable
) -> list[str]:
    """`families` is the backend's catalogue (None: the backend is unknown, nothing to check
    them against)."""
    problems = []
    for key in ("families", "variations", "modes", "policies"):
        problems += _duplicate_problems(f"benchmark.{key}", block.get(key))
    chosen = _strings(block.get("families", ["posvar"]))
    for family in chosen if families is not None else []:
        if family not in families:
            problems.append(_unknown("benchmark.families", "family", family, sorted(families)))
    if block.get("variations") is not None and families is not None:
        known = sorted({v for f in chosen for v in families.get(f, [])})
        for variation in _strings(block["variations"]):
            if variation not in known:
                problems.append(
                    _unknown(
                        "benchmark.variations", "variation of the chosen families", variation, known
                    )
                )
    known_modes = mode_table.names()
    for mode in _strings(block.get("modes")):
        if mode not in known_modes:
            problems.append(_unknown("benchmark.modes", "mode", mode, known_modes))
    overrides = block.get("mode_overrides")
    for mode, override in overrides.items() if isinstance(overrides, dict) else []:
        key = f"benchmark.mode_overrides.{mode}"
        if mode not in known_modes:
            problems.append(_unknown("benchmark.mode_overrides", "mode", str(mode), known_modes))
        if not isinstance(override, dict):
            continue
        problems += _workflow_source_problems(key, mode, override, mode_table)
        problems += _workflow_dir_problems(
            f"{key}.workflow_dir", override.get("workflow_dir"), base
        )
        policy = override.get("policy_id")
        if isinstance(policy, str) and policy not in policies:
            problems.append(
                f"{key}.policy_id: {policy!r} is not in the policies: registry; add it there"
            )
    for policy in _strings(block.get("policies")):
        if policy not in policies:
            problems.append(
                f"benchmark.policies: {policy!r} is not in the policies: registry; add an entry "
                "with url, command or preset"
            )
    problems += _same_server_problems(_strings(block.get("policies")), policies)
    problems += _id_problems("benchmark.task_ids", block.get("task_ids"))
    problems += _id_problems("benchmark.seeds", block.get("seeds"))
    return problems


def _suite_problems(key: str, entry: dict, base: Path, backend) -> list[str]:
    problems = []
    if isinstance(entry.get("suite_name"), str) and backend is not None:
        try:
            suite_variation(entry["suite_name"], backend)
        except GapError as exc:
            problems.append(f"{key}.suite_name: {exc}")
    problems += _workflow_dir_problems(f"{key}.workflow_dir", entry.get("workflow_dir"), base)
    problems += _id_problems(f"{key}.task_ids", entry.get("task_ids"))
    problems += _id_problems(f"{key}.seeds", entry.get("seeds"))
    prompts = entry.get("task_prompts")
    problems += _id_problems(
        f"{key}.task_prompts", list(prompts) if isinstance(prompts, dict) else None
    )
    return problems


def _server_key(url: str) -> tuple:
    """What makes two urls the same server: scheme, host (loopback names as one), port, path."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port or {"ws": 80, "http": 80, "wss": 443, "https": 443}.get(parts.scheme)
    except ValueError:
        return (url,)
    host = (parts.hostname or "").lower()
    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0"):
        host = "loopback"
    return (parts.scheme.lower(), host, port, parts.path.rstrip("/"))


def _same_server_problems(compared: list[str], policies: dict) -> list[str]:
    """Two policies of one comparison on one server compare a checkpoint with itself: a
    difference near zero that every check passes. One server per checkpoint."""
    seen: dict[tuple, str] = {}
    problems = []
    for pid in dict.fromkeys(compared):
        entry = policies.get(pid)
        url = entry.get("url") if isinstance(entry, dict) else None
        if not isinstance(url, str):
            continue  # managed servers each get their own port
        first = seen.setdefault(_server_key(url), pid)
        if first != pid:
            problems.append(
                f"benchmark.policies: {first!r} and {pid!r} point at the same server ({url}); "
                "a comparison needs one server per checkpoint: give each its own url"
            )
    return problems


def _duplicate_problems(key: str, values: Any) -> list[str]:
    """A family, variation, mode or policy listed twice would run (and count) its cells twice."""
    if not isinstance(values, list):
        return []
    # counted once each (list.count per value was quadratic: 60,000 names took 80 s)
    counts = Counter(v for v in values if isinstance(v, str | int | float | bool))
    return [
        f"{key}: {value!r} is listed {n} times; each entry makes its own "
        "cells, so a repeat would run and count them again: list it once"
        for value, n in counts.items()
        if n > 1
    ]


def _id_problems(key: str, ids: Any) -> list[str]:
    if not isinstance(ids, list):
        return []
    ids = [i for i in ids if isinstance(i, int)]
    problems = []
    if any(i < 0 for i in ids):
        problems.append(f"{key}: ids are 0-based and cannot be negative (got {ids})")
    if len(set(ids)) != len(ids):
        problems.append(f"{key}: an id is listed twice (got {ids})")
    return problems


def _workflow_source_problems(
    key: str, mode: Any, override: dict, mode_table: ModeTable
) -> list[str]:
    """A mode override names its workflow by `template` or `workflow_dir` (one of them), and
    only for a mode whose producer starts from a given workflow."""
    given = [k for k in ("template", "workflow_dir") if override.get(k) is not None]
    if mode in mode_table.names() and given and not mode_table.needs_workflow(mode):
        return [
            f"{key}.{given[0]}: the {mode} mode produces its own workflow; remove {given[0]} "
            "(mode workflow runs a directory as written)"
        ]
    if len(given) == 2:
        return [f"{key}: set template or workflow_dir, not both"]
    template = override.get("template")
    if isinstance(template, str) and template not in template_names():
        return [f"{key}.template: {unknown_template(template)}"]
    return []


def _workflow_dir_problems(key: str, raw: Any, base: Path) -> list[str]:
    if not isinstance(raw, str):
        return []
    path = (base / raw).expanduser().resolve()
    if not (path / "workflow.json").is_file():
        return [f"{key}: {path} has no workflow.json; point it at a workflow directory"]
    return []


def suite_variation(suite_name: str, backend="libero"):
    """The Variation a suites-mode `suite_name` names on `backend` (a Backend or its name):
    `family/variation`, or one of the backend's suites."""
    chosen = sim.get_backend(backend) if isinstance(backend, str) else backend
    return sim.suite_variation(chosen, suite_name)
