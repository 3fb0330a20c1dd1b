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
    """The LLM that writes workflows (llm_generation, llm_plus_policy): provider, model, limits."""

    # The LLM provider: any OpenAI-compatible endpoint (openrouter, openai) or Vertex.
    provider: Literal["openrouter", "openai", "vertex"] = "openrouter"
    # The model name as the provider spells it, e.g. openai/gpt-4.1 on OpenRouter.
    model: str | None = None
    # An OpenAI-compatible base URL instead of the provider's.
    endpoint: Annotated[
        str | None, ServerOnly("the server would send its requests (and a key) there", NO_LLM)
    ] = None
    # The key; unset, read from the provider's environment variable (never written to records).
    api_key: Annotated[str | None, ServerOnly("a key the server would use", NO_LLM)] = Field(
        default=None, repr=False
    )
    # Vertex: the Google Cloud project.
    project_id: str | None = None
    # Vertex: the region.
    region: str | None = None
    # Sampling temperature of every request.
    temperature: float = 0.7
    # The most tokens an answer may have; unset, the provider's limit.
    max_tokens: PositiveInt | None = None
    # Requests in flight at once across every worker process of a machine.
    max_concurrent_requests: PositiveInt = 4
    # Where answers are cached by request (else $GAP_LLM_CACHE or the default cache).
    cache_dir: Annotated[Path | None, ServerOnly("a path on the server", NO_LLM)] = None
    # Each request's own bound, and how often a failed one is tried again: producing is not
    # charged to a trial's watchdog, so these bound a hanging endpoint (TrialRun._produce).
    timeout_s: PositiveFloat = 120.0
    max_retries: NonNegativeInt = 5  # retries of a failed request (429s and 5xx) before giving up
