"""Placeholder values a task's instruction provides to a workflow template."""

from __future__ import annotations

from pytest_gap.instructions import DEFAULT_CONTAINER, parse_instruction


def task_placeholders(prompt: str) -> dict[str, str]:
    """{{target}}, {{container}}, {{relation}} ("in"/"on") and {{items}} from the task
    instruction.

    A pick-and-place instruction in any common phrasing ("pick up the X and place it in the Y",
    "grab X and put it into Y", `instructions.parse_instruction`) gives target X, container Y;
    "pack A, B and C into the Y" gives items "A, B, C", target A, container Y.
    The container defaults to the basket when the instruction names none.
    """
    parsed = parse_instruction(prompt)
    if parsed is None:
        return {"container": DEFAULT_CONTAINER, "relation": "in"}
    return {
        "target": parsed.items[0],
        "items": ", ".join(parsed.items),
        "container": parsed.container,
        "relation": parsed.relation,
    }
