"""The `llm:` section: which model writes workflows (LLM modes), and how its calls are bounded.

A leaf of the config package: the producers (pytest_gap/producers/) read these settings and
import nothing else of the config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from pytest_gap.config.keys import NO_LLM, ServerOnly, Strict

# Upper bounds, far above any provider's: a typo is a config error, not a session that waits or
# retries for ever (an infinite timeout, 10**9 retries).
MAX_TEMPERATURE = 2.0  # OpenAI's and OpenRouter's range is 0..2
MAX_TOKENS = 10_000_000
MAX_CONCURRENT = 1024
MAX_TIMEOUT_S = 3600.0
MAX_RETRIES = 100


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
    temperature: float = Field(0.7, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    # The most tokens an answer may have; unset, the provider's limit.
    max_tokens: int | None = Field(None, gt=0, le=MAX_TOKENS)
    # Requests in flight at once across every worker process of a machine.
    max_concurrent_requests: int = Field(4, gt=0, le=MAX_CONCURRENT)
    # Where answers are cached by request (else $GAP_LLM_CACHE or the default cache).
    cache_dir: Annotated[Path | None, ServerOnly("a path on the server", NO_LLM)] = None
    # Each request's own bound, and how often a failed one is tried again: producing is not
    # charged to a trial's watchdog, so these bound a hanging endpoint (TrialRun._produce).
    timeout_s: float = Field(120.0, gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)
    # Retries of a failed request (429s and 5xx) before giving up.
    max_retries: int = Field(5, ge=0, le=MAX_RETRIES)
