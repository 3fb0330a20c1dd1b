"""How the config's keys are declared: strict models, and what a submitted config may hold.

Every model of the config is `Strict`: an unknown key is an error (a typo must not silently fall
back to a default). The marks say which keys a config that arrived over the network may not
hold (`ServerOnly`) or may hold only with some values (`RemoteValue`); `remote.py` reads them.
They are put where each key is defined, so a new key is marked where it is added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# A config submitted over the network (`gap serve`'s /control, `gap online`) is data: it may not
# name code to import, a command to run or a path on the server. The keys that do are marked
# where the model defines them, so a new key is marked where it is added.
Profile = Literal["file", "remote"]


@dataclass(frozen=True)
class ServerOnly:
    """A key only the operator's own configs may hold (a file, `gap serve --config`); a
    submitted config naming it is refused: `why` says what the value would make the server do,
    `fix` what to write instead."""

    why: str
    fix: str = "remove it"


@dataclass(frozen=True)
class RemoteValue:
    """A key a submitted config may hold only with a value `check` accepts (it returns why
    not, or None)."""

    check: Callable[[Any], str | None]


SERVER_PATH = ServerOnly("a path on the server", "remove it: a service run keeps to its run dir")
NO_LLM = "remove it: a service run calls no LLM"
SERVER_COMMAND = "remove it and give url: (a placeholder: the client's policy answers)"
