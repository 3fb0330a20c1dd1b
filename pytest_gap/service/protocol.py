"""What the evaluation server and its clients say to each other.

Control plane, plain HTTP with JSON bodies (`GET`): `/healthz`, `/runs/<run id>` (RunStatus).
Submissions travel as one request frame on the websocket path `/control` (the websocket layer
reads no HTTP request bodies): `Submit` in, `Submitted` or an error out.
Data plane, websocket path `/episodes`, frames in msgpack-numpy (policies/wire.py; never
pickle): the client's `Hello`; then, for as long as the run has episodes for it, the server
sends `{"type": "obs", "obs": ...}` and the client answers `{"type": "reply", "reply": ...}`
(what its policy answered, actions or a chunk, in the run's obs_format); finally the server
sends `{"type": "finished", ...}` and closes. Bearer token, when the server has one (it
makes one unless started with --no-token): the `Authorization` header of every request and
websocket handshake. Run secret: made at submit, returned once in `Submitted.run_secret` (the
server keeps only its SHA-256), presented in `Hello.run_secret`; without it no client attaches
to the run, so holders of one server token cannot answer each other's episodes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field

from pytest_gap.errors import GapError
from pytest_gap.names import check_name
from pytest_gap.service.limits import CEILING_ATTACHMENTS_PER_RUN

EPISODES_PATH = "/episodes"
CONTROL_PATH = "/control"
RUNS_PATH = "/runs/"
# Worker ids run from 0 to the server's --max-attachments-per-run less one (at most this): an id
# is a simulator slot, and the server keeps a line of status for each one a run has seen.
MAX_WORKER_ID = CEILING_ATTACHMENTS_PER_RUN - 1
SplitName = Literal["val_train", "val_unseen", "test"]
HELD_OUT: SplitName = "test"  # its seeds stay on the server: status names no trial of it
TOKEN_ENV = "GAP_TOKEN"  # the bearer token, for `gap serve` and clients without --token-file
# A second token of `gap serve --config --run-id ID` (the platform mints one per task): it opens
# `/episodes` (attaching to run ID only) and `GET /runs/ID`, never `/control` or another run.
CLIENT_TOKEN_ENV = "GAP_CLIENT_TOKEN"
MAX_REASONS = 50  # why trials were given up: the first this many, in a status or a card
RUN_SECRET_ENV = "GAP_RUN_SECRET"  # a run's secret, for `gap eval` without --run-secret-file
MAX_SECRET_CHARS = 200


class RunRefused(GapError):
    """A submission or attach the server will not take; the message says why and the fix (sent
    to the client as the error of its answer)."""


def check_run_id(run_id: str) -> str:
    """A run id names a directory on the server: the one name pattern of names.py."""
    return check_name(run_id, "run id")


def _config_name(name: str) -> str:
    """The submitted YAML's file name: it heads every message and record of the run, so it is
    one printable line, and no path."""
    if not (0 < len(name) <= 200 and name.isprintable() and not {"/", "\\"} & set(name)):
        raise ValueError("give the config's file name (printable, at most 200 characters, no '/')")
    return name


RunId = Annotated[str, AfterValidator(check_run_id)]


class Submit(BaseModel):
    op: Literal["submit"] = "submit"
    run_id: RunId
    config_name: Annotated[str, AfterValidator(_config_name)]  # for records and messages
    config_text: str  # read as a file is (config.read_yaml_text), never imported


class Submitted(BaseModel):
    run_id: str
    created: bool  # False: the same run was already submitted (nothing added)
    trials: int
    message: str
    run_secret: str | None = None  # made when the run is created; never sent again


class Hello(BaseModel):
    run_id: RunId
    worker_id: int = Field(ge=0, le=MAX_WORKER_ID)
    smoke: bool = False  # fake actions: a connectivity check, not an evaluation
    host: str = Field("", max_length=255)  # where the client runs, for the run's records
    metadata: dict = {}  # the policy server's metadata frame, if the client bridges one
    run_secret: str = Field(default="", max_length=MAX_SECRET_CHARS)  # what submit returned


class WorkerStatus(BaseModel):
    worker_id: int
    # refused: its client failed too many trials in a row; the id may not attach again
    state: Literal["attached", "detached", "refused"]
    host: str = ""
    smoke: bool = False
    episodes_done: int = 0
    current: str | None = None  # the trial it is running (never named on the held-out split)
    reason: str | None = None  # why it was detached or refused, when the server ended it


class RunStatus(BaseModel):
    run_id: str
    split: SplitName | None = None
    state: Literal["waiting for clients", "model loading", "active", "finished"]
    expected: int  # trials planned
    saved: int  # trials with a scored record
    in_progress: int
    remaining: int  # neither saved nor in progress
    infra_failures: int  # episodes that ended unscored (each handed out again)
    given_up: int = 0  # trials given up (runs.ServiceRun.finish): missing from the rates
    # why, one line each, the first MAX_REASONS (on the held-out split without the trial's key)
    given_up_reasons: list[str] = []
    smoke_episodes: int
    workers: list[WorkerStatus]
    gate: str | None = None  # the gate line, once finished
