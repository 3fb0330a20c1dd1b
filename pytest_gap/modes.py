"""The mode table: what each benchmark mode runs, and how its workflow is produced.

Modes differ only in how a cell's workflow is produced; scoring is shared. A row (`Mode`) names
the producer that writes the workflow for a (cell, task, instruction) (`producers/`), whether
the mode runs once per entry of `benchmark.policies` (the policy A/B axis), the shipped template
that suits it, and whether a grid runs it when `modes:` is left out. Config validation, the
plan's policy axis, the preflight's LLM check and the runner's choice of producer all read one
`ModeTable`, handed to them; nothing here is mutated at run time.

Adding a mode is adding a row: a plugin or conftest.py implements the `pytest_gap_modes` hook
(and `pytest_gap_producers` when no existing producer fits; pytest_gap/hookspecs.py). A pytest
session builds its table once from every implementation (`ModeTable.of`); `gap benchmark` and
the Python API read the table of the session they are about to start
(`benchmark.mode_table_of_session`); `gap run` (one workflow, no session) uses `BUILTIN`, the
harness's own rows and producers.

This module imports nothing of the package at import time: config and plan import it.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from pytest_gap.errors import GapError

if TYPE_CHECKING:
    from pytest_gap.producers.base import Producer


class Mode(BaseModel):
    """One row of the mode table."""

    model_config = ConfigDict(frozen=True)

    name: str
    # The key of the table's producers: "prebuilt" fills a given workflow directory, "llm" has
    # the LLM write the workflow; a plugin may bring more (`pytest_gap_producers`).
    producer: str
    # Runs once per benchmark.policies id (the cell dir gains /<policy_id>/); a cell without a
    # policy is an errored cell.
    takes_policy_axis: bool = False
    # The shipped template (pytest_gap/templates/) this mode is meant to run; error messages
    # suggest it. None: the user brings the workflow.
    template: str | None = None
    # A grid that leaves out `modes:` runs the default modes (the benchmark's ablation).
    default: bool = False
    # The mode a suites entry runs: "given" for an entry that names its workflow_dir,
    # "generated" for one that does not (the last row of the table that says so wins, so a
    # plugin's row can take a built-in's place). None: no suites entry runs it.
    suites: Literal["given", "generated"] | None = None
    description: str = ""


BUILTIN_MODES: tuple[Mode, ...] = (
    Mode(
        name="llm_generation",
        producer="llm",
        default=True,
        suites="generated",
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
        suites="given",
        description="a workflow directory of your own, run as written",
    ),
)

# name -> "module:attribute" (a Producer class or instance), imported on first use, so the
# package does not import the LLM client to run a template.
BUILTIN_PRODUCERS: dict[str, str] = {
    "prebuilt": "pytest_gap.producers.prebuilt:Prebuilt",
    "llm": "pytest_gap.producers.llm:LLMProducer",
}


class ModeTable:
    """Modes by name, in order (built-in rows first), and the producers they name.

    Immutable once built; the only state it keeps is the producers it imported, so each is
    imported and instantiated once per table."""

    def __init__(self, modes: Iterable[Mode], producers: Mapping[str, str | Producer]):
        self._modes: dict[str, Mode] = {}
        for mode in modes:
            known = self._modes.get(mode.name)
            if known is not None and known != mode:
                raise GapError(
                    f"mode {mode.name!r} is defined twice with different rows ({known!r} and "
                    f"{mode!r}); rename one of them"
                )
            self._modes[mode.name] = mode
        self._producers: dict[str, str | Producer] = dict(producers)
        for mode in self._modes.values():
            if mode.producer not in self._producers:
                known = ", ".join(self._producers)
                raise GapError(
                    f"mode {mode.name!r} names producer {mode.producer!r}, which no plugin "
                    f"provides (producers: {known}); return it from pytest_gap_producers"
                )
        self._loaded: dict[str, Producer] = {}

    @classmethod
    def of(
        cls,
        rows: Iterable[Iterable[Mode]],
        producers: Iterable[Mapping[str, str | Producer]] = (),
    ) -> ModeTable:
        """A table from hook results: lists of rows and mappings of producers, in call order.
        The same row (or producer) twice is one; a name with two definitions is a GapError."""
        found: dict[str, str | Producer] = {}
        for mapping in producers:
            for name, producer in mapping.items():
                if name in found and found[name] != producer:
                    raise GapError(
                        f"producer {name!r} is provided twice ({found[name]!r} and "
                        f"{producer!r}); rename one of them"
                    )
                found[name] = producer
        return cls([mode for group in rows for mode in group], found)

    def get(self, name: str) -> Mode:
        """The row for `name`; config validation reports unknown names before anything asks."""
        try:
            return self._modes[name]
        except KeyError:
            raise GapError(f"unknown mode {name!r}; use one of {', '.join(self._modes)}") from None

    def names(self) -> tuple[str, ...]:
        """Every mode, in table order (built-in first, then the plugins')."""
        return tuple(self._modes)

    def defaults(self) -> tuple[str, ...]:
        """The modes a grid runs when its `modes:` is left out."""
        return tuple(name for name, mode in self._modes.items() if mode.default)

    def suites_mode(self, given: bool) -> str:
        """The mode of a suites entry that names its workflow_dir (`given`) or does not."""
        role = "given" if given else "generated"
        found = [name for name, mode in self._modes.items() if mode.suites == role]
        if not found:
            raise GapError(
                f"no mode runs a suites entry {'with' if given else 'without'} a workflow_dir "
                f"(modes: {', '.join(self._modes)}); give a row suites={role!r}"
            )
        return found[-1]

    def producer(self, name: str) -> Producer:
        """The producer the mode `name` uses (imported on first use)."""
        return self.producer_named(self.get(name).producer)

    def producer_named(self, key: str) -> Producer:
        if key not in self._loaded:
            try:
                found: Any = self._producers[key]
            except KeyError:
                known = ", ".join(self._producers)
                raise GapError(f"unknown producer {key!r}; producers: {known}") from None
            if isinstance(found, str):
                found = pkgutil.resolve_name(found)
            self._loaded[key] = found() if isinstance(found, type) else found
        return self._loaded[key]

    def needs_workflow(self, name: str) -> bool:
        """Whether a cell of mode `name` names the workflow its producer starts from
        (`template` or `workflow_dir`); a mode whose producer writes the workflow itself
        accepts neither."""
        return self.producer(name).needs_source

    def needs_llm(self, name: str) -> bool:
        """Whether the producer of mode `name` calls the config's LLM (preflight checks the key
        first)."""
        return self.producer(name).needs_llm


# The harness's own rows and producers: what a caller outside a pytest session gets, and what
# the plugin returns from its own `pytest_gap_modes` / `pytest_gap_producers`.
BUILTIN = ModeTable(BUILTIN_MODES, BUILTIN_PRODUCERS)
