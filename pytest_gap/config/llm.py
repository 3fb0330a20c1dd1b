"""The `llm:` section: which model writes workflows (LLM modes), and how its calls are bounded.

A leaf of the config package: the producers (pytest_gap/producers/) read these settings and
import nothing else of the config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from pytest_gap.config.keys import NO_LLM, ServerOnly, Strict


class LLMConfig(Strict):
    provider: Literal["openrouter", "openai", "vertex"] = "openrouter"
    model: str | None = None
    endpoint: Annotated[
        str | None, ServerOnly("the server would send its requests (and a key) there", NO_LLM)
    ] = None
    api_key: Annotated[str | None, ServerOnly("a key the server would use", NO_LLM)] = Field(
        default=None, repr=False
    )
    project_id: str | None = None
    region: str | None = None
    temperature: float = 0.7
    max_tokens: PositiveInt | None = None
    max_concurrent_requests: PositiveInt = 4
    cache_dir: Annotated[Path | None, ServerOnly("a path on the server", NO_LLM)] = None
    # Each request's own bound, and how often a failed one is tried again: producing is not
    # charged to a trial's watchdog, so these bound a hanging endpoint (TrialRun._produce).
    timeout_s: PositiveFloat = 120.0
    max_retries: NonNegativeInt = 5
