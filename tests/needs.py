"""A test whose outside requirement is missing (a browser, a tmpfs mount): skipped, saying why,
on a developer's machine; failed under CI (the CI variable set, as CI services set it), so that a
CI run never passes with those tests silently skipped."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

import pytest

_NOT_SET = {"", "0", "false", "no"}


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("CI", "").strip().lower() not in _NOT_SET


def missing(reason: str) -> NoReturn:
    """Skip the running test (or fixture) for `reason`; under CI, fail it instead."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set: a CI machine must have it)", pytrace=False)
    pytest.skip(reason)
