"""The mode table: what each benchmark mode runs, and how its workflow is produced.

Modes differ only in how a cell's workflow is produced; scoring is shared. A row names the
producer that writes the workflow for a (cell, task, instruction) (`producers/`), whether the
mode runs once per entry of `benchmark.policies` (the policy A/B axis), the shipped template that
suits it, and whether a grid runs it when `modes:` is left out. Config validation, the plan's
policy axis, the preflight's LLM check and the runner's choice of producer all read this table,
so adding a mode is adding a row (`register_mode`, e.g. from a conftest or a plugin), plus a
producer in `producers/` when no existing one fits.

This module imports nothing of the package at import time: config and plan import it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from pytest_gap.errors import GapError


class Mode(BaseModel):
    """One row of the mode table."""

    model_config = ConfigDict(frozen=True)

    name: str
    # The producers registry's key (producers/base.py PRODUCERS): "prebuilt" fills a given
    # workflow directory, "llm" has the LLM write the workflow.
    producer: str
    # Runs once per benchmark.policies id (the cell dir gains /<policy_id>/); a cell without a
    # policy is an errored cell.
    takes_policy_axis: bool = False
    # The shipped template (pytest_gap/templates/) this mode is meant to run; error messages
    # suggest it. None: the user brings the workflow.
    template: str | None = None
    # A grid that leaves out `modes:` runs the default modes (the benchmark's ablation).
    default: bool = False
    description: str = ""

    @property
    def needs_workflow(self) -> bool:
        """Whether a cell names the workflow its producer starts from (`template` or
        `workflow_dir`); a mode whose producer writes the workflow itself accepts neither."""
        from pytest_gap.producers.base import producer_for

        return producer_for(self.producer).needs_source

    @property
    def needs_llm(self) -> bool:
        """Whether its producer calls the config's LLM (preflight checks the key first)."""
        from pytest_gap.producers.base import producer_for

        return producer_for(self.producer).needs_llm


_MODES: dict[str, Mode] = {
    mode.name: mode
    for mode in (
        Mode(
            name="llm_generation",
            producer="llm",
            default=True,
            description="an LLM writes the whole workflow per task, zero-shot",
        ),
        Mode(
            name="llm_plus_policy",
            producer="prebuilt",
            takes_policy_axis=True,
            template="llm_plus_policy",
            default=True,
            description="a fixed template: OBB approach, then a run_policy VLA node",
        ),
        Mode(
            name="policy_only",
            producer="prebuilt",
            takes_policy_axis=True,
            template="policy_only",
            default=True,
            description="bare-VLA baseline: home, open gripper, run_policy",
        ),
        Mode(
            name="workflow",
            producer="prebuilt",
            description="a workflow directory of your own, run as written",
        ),
    )
}


def register_mode(mode: Mode) -> Mode:
    """Add a row to the table (a mode a plugin or conftest brings). Registering the same row
    again is a no-op (conftests are imported by every xdist worker); a different row under a
    taken name is an error."""
    known = _MODES.get(mode.name)
    if known is not None and known != mode:
        raise GapError(f"mode {mode.name!r} is already registered with another definition")
    _MODES[mode.name] = mode
    return mode


def get_mode(name: str) -> Mode:
    """The row for `name`; config validation reports unknown names before anything asks."""
    try:
        return _MODES[name]
    except KeyError:
        raise GapError(f"unknown mode {name!r}; use one of {', '.join(_MODES)}") from None


def mode_names() -> tuple[str, ...]:
    """Every mode, in table order (built-in first, then registered ones)."""
    return tuple(_MODES)


def default_modes() -> tuple[str, ...]:
    return tuple(name for name, mode in _MODES.items() if mode.default)
