"""Matched control arms: a perturbed cell beside its family's declared control, the same tasks
and seeds without the perturbation (sim/backend.py `declared_control`), so the summary can give
the paired drop the perturbation costs (control_drop.py).

Planning only, pure over the cells: `benchmark.controls: true` adds each perturbed cell's
control arm where its row (mode, policy, backend) does not run it already; then every cell
whose control runs in its row is marked with that cell's key (`Cell.control`). A grid that
lists the control itself (`families: [posvar, libero]`) is marked the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_gap.cells import Cell
from pytest_gap.config.messages import ConfigError
from pytest_gap.errors import SimInputError
from pytest_gap.sim.backend import declared_control, get_backend, resolve_variation

Row = tuple[str, str | None, str]  # (mode, policy id, backend)
Arm = tuple[str, str]  # (family, variation)


def _row(cell: Cell) -> Row:
    return cell.mode, cell.policy_id, cell.backend


def _declared(source: str) -> Callable[[Cell], Arm | None]:
    """Each cell's declared control, asked of its backend once per (family, variation); a
    backend whose declaration is broken is a config error naming it."""
    seen: dict[tuple[str, str, str], Arm | None] = {}

    def control_of(cell: Cell) -> Arm | None:
        key = (cell.backend, cell.family, cell.variation)
        if key not in seen:
            try:
                seen[key] = declared_control(get_backend(cell.backend), cell.family, cell.variation)
            except SimInputError as exc:
                raise ConfigError(source, [str(exc)]) from None
        return seen[key]

    return control_of


def with_controls(cells: list[Cell], source: str, add: bool) -> list[Cell]:
    """`cells` with each perturbed cell marked with its control's key where that control runs
    in its row; with `add`, missing control arms are first inserted, each just before the
    first cell of its row that needs it, with that cell's tasks, seeds and settings."""
    control_of = _declared(source)
    if add:
        if not any(control_of(c) for c in cells):
            raise ConfigError(
                source,
                [
                    "benchmark.controls: true, but no variation of the grid declares a control "
                    "arm (posvar's do, and LIBERO-PRO's that keep their base suite's tasks); "
                    "remove it, or add such a family"
                ],
            )
        cells = _added(cells, control_of, source)
    arms: dict[tuple[Row, Arm], str] = {}
    for cell in cells:
        arms.setdefault((_row(cell), (cell.family, cell.variation)), cell.key)
    marked = []
    for cell in cells:
        named = control_of(cell)
        key = arms.get((_row(cell), named)) if named else None
        marked.append(cell.model_copy(update={"control": key}) if key else cell)
    return marked


def _added(cells: list[Cell], control_of, source: str) -> list[Cell]:
    present = {(_row(c), (c.family, c.variation)) for c in cells}
    out: list[Cell] = []
    problems: list[str] = []
    for cell in cells:
        named = control_of(cell)
        if named and (_row(cell), named) not in present:
            present.add((_row(cell), named))
            control, problem = _control_cell(cell, named)
            if problem:
                problems.append(problem)
            else:
                out.append(control)
        out.append(cell)
    if problems:
        raise ConfigError(source, problems)
    return out


def _control_cell(cell: Cell, arm: Arm) -> tuple[Cell | None, str | None]:
    """The control arm of `cell`: the same cell on the control's suite, unperturbed."""
    backend = get_backend(cell.backend)
    suite = resolve_variation(backend, *arm).suite
    missing = [t for t in cell.task_ids if backend.n_init_states(suite, t) == 0]
    if missing:
        return None, (
            f"benchmark.controls: the control of {cell.family}/{cell.variation} is "
            f"{arm[0]}/{arm[1]}, whose tasks {missing} ship no init states; leave them out of "
            "task_ids or set controls: false"
        )
    fields = cell.model_dump()
    fields.update(family=arm[0], variation=arm[1], suite=suite, suite_name=None, control=None)
    return Cell.model_validate(fields), None
