"""What the evaluation server and its clients say to each other.

Control plane, plain HTTP with JSON bodies (`GET`): `/healthz`, `/runs/<run id>` (RunStatus).
Submissions travel as one request frame on the websocket path `/control` (the websocket layer
reads no HTTP request bodies): `Submit` in, `Submitted` or an error out.
Data plane, websocket path `/episodes`, frames in msgpack-numpy (policies/wire.py; never
pickle): the client's `Hello`; then, for as long as the run has episodes for it, the server
sends `{"type": "obs", "obs": ...}` and the client answers `{"type": "reply", "reply": ...}`
(what its policy answered, actions or a chunk, in the run's obs_format); finally the server
sends `{"type": "finished", ...}` and closes. Bearer token, when the server has one: the
`Authorization` header of every request and websocket handshake.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

EPISODES_PATH = "/episodes"
CONTROL_PATH = "/control"
RUNS_PATH = "/runs/"
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
SplitName = Literal["val_train", "val_unseen", "test"]
HELD_OUT: SplitName = "test"  # its seeds stay on the server: status names no trial of it
SMOKE_DIR = "smoke"  # fake-action episodes: recorded here, never folded into a rate
TOKEN_ENV = "GAP_TOKEN"  # the bearer token, for `gap serve` and clients without --token-file


def check_run_id(run_id: str) -> str:
    """A run id names a directory on the server: letters, digits, `_`, `.`, `-`."""
    if not re.match(RUN_ID_PATTERN, run_id):
        raise ValueError(
            f"run id {run_id!r}: use letters, digits, '_', '.' and '-' (at most 100, starting "
            "with a letter or digit)"
        )
    return run_id


class Submit(BaseModel):
    op: Literal["submit"] = "submit"
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    config_name: str  # the YAML's file name, for records and messages
    config_text: str


class Submitted(BaseModel):
    run_id: str
    created: bool  # False: the same run was already submitted (nothing added)
    trials: int
    message: str


class Hello(BaseModel):
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    worker_id: int = Field(ge=0)
    smoke: bool = False  # fake actions: a connectivity check, not an evaluation
    host: str = ""  # where the client runs, for the run's records
    metadata: dict = {}  # the policy server's metadata frame, if the client bridges one


class WorkerStatus(BaseModel):
    worker_id: int
    state: Literal["attached", "detached"]
    host: str = ""
    smoke: bool = False
    episodes_done: int = 0
    current: str | None = None  # the trial it is running (never named on the held-out split)


class RunStatus(BaseModel):
    run_id: str
    split: SplitName | None = None
    state: Literal["waiting for clients", "model loading", "active", "finished"]
    expected: int  # trials planned
    saved: int  # trials with a scored record
    in_progress: int
    remaining: int  # neither saved nor in progress
    infra_failures: int  # episodes that ended unscored (each handed out again)
    given_up: int = 0  # trials the harness failed to run MAX_ATTEMPTS times: missing
    smoke_episodes: int
    workers: list[WorkerStatus]
    gate: str | None = None  # the gate line, once finished
