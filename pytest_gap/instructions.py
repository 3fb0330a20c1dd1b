"""Reading a task instruction: which items go into which container. Pure text, no simulator."""

from __future__ import annotations

import re

from pydantic import BaseModel

_PICK_PLACE = re.compile(
    r"pick (?:up )?(?:the )?(?P<target>.+?) and (?:place|put) it (?:in|into|on) (?:the )?"
    r"(?P<container>.+)"
)
_PACK = re.compile(r"pack (?P<items>.+) into (?:the )?(?P<container>.+)")
DEFAULT_CONTAINER = "basket"


class Instruction(BaseModel):
    items: list[str]
    container: str


def parse_instruction(prompt: str) -> Instruction | None:
    """Items and container of "pick (up) (the) X and place it in (the) Y" or "pack A, B and C
    into the Y"; None for anything else."""
    text = prompt.strip().rstrip(".").lower()
    match = _PICK_PLACE.fullmatch(text)
    if match:
        return Instruction(items=[match["target"]], container=match["container"])
    match = _PACK.fullmatch(text)
    if match:
        parts = re.split(r",\s*|\s+and\s+", match["items"])
        items = [re.sub(r"^the\s+", "", p).strip() for p in parts if p.strip()]
        return Instruction(items=items, container=match["container"])
    return None
