"""An OpenAI-compatible chat client for workflow generation: settings, cache, retries, a cap.

- Providers: openrouter (default), openai, vertex (its OpenAI-compatible endpoint), or any
  `endpoint` (vLLM, ollama, a proxy). The key comes from `llm.api_key` or the provider's
  environment variable; it is never written anywhere.
- Every response is cached on disk, keyed by SHA-256 of (provider, endpoint, model,
  temperature, max_tokens, messages): re-scoring a run never pays twice for the same prompt,
  and two servers that serve a model under the same name never share answers.
- 429, 5xx, timeouts and dropped connections are retried with exponential backoff and jitter
  (a Retry-After header is honoured); when retries run out the LLM is *unavailable*, an
  infrastructure failure.
- An answer only the user can fix (401 key refused, 402 no credit, 403 model not allowed for
  the key, 404 or "not a valid model" for an unknown model or a wrong endpoint) is an
  LLMConfigError naming the provider, the model and the setting to fix. `check()` asks for one
  token so that a session finds these before any trial (see pytest_gap/servers/preflight.py).
- At most `max_concurrent_requests` requests are in flight across all worker processes of a
  machine (file-lock slots next to the cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from pytest_gap.config.llm import LLMConfig
from pytest_gap.errors import GapError, InfraFailure
from pytest_gap.throttle import slot

CACHE_VAR = "GAP_LLM_CACHE_DIR"
DEFAULT_CACHE = Path.home() / ".cache" / "pytest-gap" / "llm"
PROVIDERS = {
    "openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
    "vertex": (
        "https://{region}-aiplatform.googleapis.com/v1beta1/projects/{project_id}/locations/"
        "{region}/endpoints/openapi",
        "VERTEX_ACCESS_TOKEN",
    ),
}


class LLMConfigError(GapError, ValueError):
    """The llm: block cannot be used as it stands (no model, no key, no project)."""


class LLMUnavailable(InfraFailure):
    """The LLM endpoint kept failing (rate limits, server errors, timeouts)."""


class LLMSettings(BaseModel):
    provider: str
    model: str
    base_url: str
    api_key: str = Field(repr=False, exclude=True)
    # Where the key came from (llm.api_key or the variable's name; None: no key was found and
    # an endpoint is tried without one), for errors that say what to fix.
    key_source: str | None = None
    source: str = "config"  # the config file, for errors
    temperature: float
    max_tokens: int | None
    max_concurrent_requests: int
    cache_dir: Path
    timeout_s: float = 120.0
    max_retries: int = 5


def resolve_settings(llm: LLMConfig, source: str = "config") -> LLMSettings:
    """Settings for a config's llm: block; raises LLMConfigError naming what to set."""
    if not llm.model:
        raise LLMConfigError(
            f"{source}: llm.model is not set; name the model, e.g. openai/gpt-4.1 on OpenRouter"
        )
    base_url, key_var = PROVIDERS[llm.provider]
    if llm.endpoint:  # an OpenAI-compatible server: OpenAI's variable, if it needs a key at all
        base_url, key_var = llm.endpoint, "OPENAI_API_KEY"
    elif llm.provider == "vertex":
        if not llm.project_id or not llm.region:
            raise LLMConfigError(f"{source}: provider vertex needs llm.project_id and llm.region")
        base_url = base_url.format(region=llm.region, project_id=llm.project_id)
    api_key = llm.api_key or os.environ.get(key_var)
    key_source = "llm.api_key" if llm.api_key else (key_var if api_key else None)
    if not api_key:
        if not llm.endpoint:
            raise LLMConfigError(
                f"{source}: no API key for provider {llm.provider}; set {key_var} (or llm.api_key)"
            )
        api_key = "EMPTY"  # local OpenAI-compatible servers usually need none
    cache = llm.cache_dir or Path(os.environ.get(CACHE_VAR) or DEFAULT_CACHE)
    return LLMSettings(
        provider=llm.provider if not llm.endpoint else "openai-compatible",
        model=llm.model,
        base_url=base_url.rstrip("/"),
        api_key=api_key,
        temperature=llm.temperature,
        max_tokens=llm.max_tokens,
        max_concurrent_requests=llm.max_concurrent_requests,
        cache_dir=Path(cache).expanduser(),
        timeout_s=llm.timeout_s,
        max_retries=llm.max_retries,
        key_source=key_source,
        source=source,
    )


def cache_key(
    settings: LLMSettings, messages: list[dict[str, str]], schema: dict | None = None
) -> str:
    request = {
        "provider": settings.provider,
        "endpoint": settings.base_url,
        "model": settings.model,
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
        "messages": messages,
    }
    if schema is not None:  # a different output contract is a different request
        request["schema"] = schema
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "[REDACTED]") if secret and secret != "EMPTY" else text


# How servers say a model does not exist: OpenAI and vLLM answer 404 "The model `x` does not
# exist", ollama 404 "model 'x' not found", OpenRouter 400 "x is not a valid model ID".
_NO_SUCH_MODEL = re.compile(
    r"(not a valid|invalid|unknown|no such) model|model.{0,80}?(not found|does not exist)", re.I
)


def _server_message(exc, secret: str | None) -> str:
    """The server's own short reason for an error status: one line, key redacted, capped."""
    body = getattr(exc, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    text = " ".join(str(message or exc).split())
    text = redact(text, secret)
    return text if len(text) <= 160 else text[:157] + "..."


def config_problem(exc: Exception, settings: LLMSettings) -> LLMConfigError | None:
    """The LLMConfigError for an answer only the user can fix, or None (retry or infra)."""
    import openai

    if not isinstance(exc, openai.APIStatusError):
        return None
    status = exc.status_code
    reason = _server_message(exc, settings.api_key)
    said = f"({status}: {reason})"
    where = f"{settings.source}: llm provider {settings.provider} at {settings.base_url}"
    if settings.key_source == "llm.api_key":
        key = "llm.api_key"
    elif settings.key_source:
        key = f"{settings.key_source} (or llm.api_key)"
    else:
        key = "OPENAI_API_KEY or llm.api_key (the endpoint wants a key)"
    model = f"model {settings.model!r}"
    if status == 401:
        return LLMConfigError(f"{where} refused the API key for {model} {said}; fix {key}")
    if status == 402:
        return LLMConfigError(
            f"{where} will not serve {model} on this key's account {said}; add credit or fix {key}"
        )
    if status == 403:
        return LLMConfigError(
            f"{where} does not allow this key to use {model} {said}; fix {key} or llm.model"
        )
    no_such_model = _NO_SUCH_MODEL.search(reason)
    if status == 404 and not no_such_model and settings.provider == "openai-compatible":
        return LLMConfigError(
            f"{where} answered 404 for chat/completions with {model} {said}; fix llm.endpoint "
            "(the OpenAI-compatible base url, usually ending in /v1) or llm.model"
        )
    if status == 404 or (status in (400, 422) and no_such_model):
        return LLMConfigError(f"{where} has no {model} {said}; fix llm.model")
    return None


class ChatClient:
    def __init__(self, settings: LLMSettings, *, sleep=time.sleep):
        from openai import OpenAI

        self.settings, self._sleep = settings, sleep
        self.http_calls = 0  # requests that reached the endpoint (cache misses, retries)
        self._structured = True  # dropped if the endpoint rejects response_format
        self._client = OpenAI(
            api_key=settings.api_key,
            base_url=settings.base_url,
            max_retries=0,  # retries are ours: backoff, jitter, Retry-After, a clear error
            timeout=settings.timeout_s,
        )

    def complete(
        self, messages: list[dict[str, str]], schema: dict | None = None
    ) -> tuple[str, bool]:
        """The assistant's text for `messages`, and whether it came from the cache.

        With `schema`, the answer is requested as structured output (a JSON schema) where the
        endpoint supports it; otherwise as a JSON object, or plain text if it supports neither.
        """
        key = cache_key(self.settings, messages, schema)
        path = self.settings.cache_dir / f"{key}.json"
        if path.is_file():
            try:
                return json.loads(path.read_text())["response"], True
            except (OSError, ValueError, KeyError):
                pass  # a torn cache entry is a miss
        with slot(self.settings.cache_dir / ".slots", self.settings.max_concurrent_requests):
            text = self._with_retries(lambda: self._call(messages, schema))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"model": self.settings.model, "response": text}))
        os.replace(tmp, path)
        return text, False

    def check(self) -> None:
        """Ask for one token, uncached: raise LLMConfigError when the provider refuses the key
        or does not know the model, LLMUnavailable when it cannot be reached (after retries).

        A chat completion is the one request every OpenAI-compatible server implements and
        authenticates (OpenRouter's model list needs no key; vLLM has no model lookup). A 400
        other than "no such model" passes: the key and model were accepted, only this probe's
        parameters were not (some models refuse max_tokens).
        """
        import openai

        def probe() -> str:
            self.http_calls += 1
            try:
                self._client.chat.completions.create(
                    model=self.settings.model,
                    messages=[{"role": "user", "content": "Reply with OK."}],
                    max_tokens=1,
                    stream=False,
                )
            except openai.BadRequestError as exc:
                if config_problem(exc, self.settings) is not None:
                    raise
            return ""

        self._with_retries(probe)

    def _with_retries(self, call) -> str:
        """`call()`, retried on rate limits, server errors, timeouts and dropped connections."""
        import openai

        retryable = (
            openai.RateLimitError,
            openai.InternalServerError,
            openai.APITimeoutError,
            openai.APIConnectionError,
        )
        last = None
        for attempt in range(self.settings.max_retries + 1):
            try:
                return call()
            except retryable as exc:
                last = exc
                if attempt == self.settings.max_retries:
                    break
                self._sleep(self._backoff(attempt, exc))
            except openai.APIStatusError as exc:
                problem = config_problem(exc, self.settings)
                if problem is not None:
                    raise problem from None
                if self._structured and "response_format" in str(exc):
                    self._structured = False  # `call` reads it: the retry is a plain request
                    return self._with_retries(call)
                raise LLMUnavailable(
                    f"{self.settings.base_url} rejected the request: "
                    f"{redact(str(exc), self.settings.api_key)}"
                ) from None
        raise LLMUnavailable(
            f"{self.settings.base_url} failed {self.settings.max_retries + 1} times; last: "
            f"{type(last).__name__}: {redact(str(last), self.settings.api_key)}"
        )

    @staticmethod
    def _backoff(attempt: int, exc: Exception) -> float:
        response = getattr(exc, "response", None)
        retry_after = response.headers.get("retry-after") if response is not None else None
        if retry_after:
            try:
                return min(float(retry_after), 60.0)
            except ValueError:
                pass
        return min(2.0**attempt, 30.0) * (0.5 + random.random())

    def _call(self, messages: list[dict[str, str]], schema: dict | None) -> str:
        self.http_calls += 1
        kwargs: dict[str, Any] = {
            "model": self.settings.model,
            "messages": messages,
            "temperature": self.settings.temperature,
            "stream": False,
        }
        if self.settings.max_tokens:
            kwargs["max_tokens"] = self.settings.max_tokens
        if self._structured:
            kwargs["response_format"] = (
                {
                    "type": "json_schema",
                    "json_schema": {"name": "workflow", "schema": schema, "strict": False},
                }
                if schema is not None
                else {"type": "json_object"}
            )
        response = self._client.chat.completions.create(**kwargs)
        choices = getattr(response, "choices", None) or []
        content = choices[0].message.content if choices else None
        return content or ""
