"""The one way to call a model: the openai SDK against any OpenAI-compatible provider, every call
written to the LLMCall ledger (tokens, latency, cost, error).

`complete` (AsyncOpenAI) serves async code (the chat planner); `complete_sync` (OpenAI) serves sync
worker code (life-loop turns, summaries), so sync code never wraps async code. Both build the same
request and record the same ledger row."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import openai
from asgiref.sync import sync_to_async
from openai import AsyncOpenAI, OpenAI

from chat.models import LLMCall
from maibot.config import BotConfig, get_config

logger = logging.getLogger(__name__)

# One client per event loop and provider settings: the SDK's HTTP pool is bound to its loop.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, AsyncOpenAI]] = weakref.WeakKeyDictionary()


def get_client(cfg: BotConfig | None = None) -> AsyncOpenAI:
    cfg = cfg or get_config()
    key = (cfg.llm_base_url, cfg.llm_api_key, cfg.llm.max_retries)
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    client = per_loop.get(key)
    if client is None:
        client = AsyncOpenAI(base_url=cfg.llm_base_url, api_key=cfg.llm_api_key, max_retries=cfg.llm.max_retries)
        per_loop[key] = client
    return client


# One sync client per provider settings, shared by the worker's threads (its HTTP pool is thread-safe).
_sync_clients: dict[tuple, OpenAI] = {}
_sync_lock = threading.Lock()


def get_sync_client(cfg: BotConfig | None = None) -> OpenAI:
    cfg = cfg or get_config()
    key = (cfg.llm_base_url, cfg.llm_api_key, cfg.llm.max_retries)
    with _sync_lock:
        client = _sync_clients.get(key)
        if client is None:
            client = OpenAI(base_url=cfg.llm_base_url, api_key=cfg.llm_api_key, max_retries=cfg.llm.max_retries)
            _sync_clients[key] = client
    return client


@dataclass
class ToolCallRequest:
    """A tool call as the model asked for it. `arguments` is None when they were not valid JSON."""

    id: str
    name: str
    raw_arguments: str
    arguments: dict[str, Any] | None
    argument_error: str = ""


@dataclass
class LLMResult:
    content: str = ""
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    assistant_message: dict[str, Any] | None = None  # to append to the conversation for the next round
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    latency_ms: int = 0
    error: str = ""
    timed_out: bool = False
    call_id: int | None = None

    @property
    def ok(self) -> bool:
        return not self.error


def _parse_tool_calls(raw_calls: Any) -> list[ToolCallRequest]:
    calls = []
    for tc in raw_calls or []:
        raw = tc.function.arguments or ""
        try:
            args = json.loads(raw) if raw.strip() else {}
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
            calls.append(ToolCallRequest(id=tc.id, name=tc.function.name, raw_arguments=raw, arguments=args))
        except ValueError as exc:
            calls.append(
                ToolCallRequest(
                    id=tc.id, name=tc.function.name, raw_arguments=raw, arguments=None, argument_error=str(exc)
                )
            )
    return calls


def cost_of(prompt_tokens: int, completion_tokens: int, cfg: BotConfig | None = None) -> Decimal:
    llm = (cfg or get_config()).llm
    cost = prompt_tokens * llm.price_input_per_1m / 1e6 + completion_tokens * llm.price_output_per_1m / 1e6
    return Decimal(str(round(cost, 6)))


def _record(*, purpose: str, model: str, result: LLMResult, session_id: int | None, cycle_id: int | None) -> int:
    call = LLMCall.objects.create(
        purpose=purpose,
        model=model,
        session_id=session_id,
        cycle_id=cycle_id,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        cached_tokens=result.cached_tokens,
        latency_ms=result.latency_ms,
        cost=cost_of(result.prompt_tokens, result.completion_tokens),
        error=result.error[:2000],
    )
    return call.pk


def _request(
    cfg: BotConfig, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, timeout: float | None
) -> dict[str, Any]:
    """The chat-completions arguments (the same for the async and the sync client)."""
    kwargs: dict[str, Any] = {
        "model": cfg.llm_model,
        "messages": messages,
        "temperature": cfg.llm.temperature,
        "timeout": timeout or cfg.llm.timeout,
    }
    if tools:
        kwargs["tools"] = tools
    return kwargs


def _read(response: Any, result: LLMResult) -> None:
    """Fill the result from the provider's answer (raises ValueError on an answer without choices)."""
    choice = response.choices[0] if response.choices else None
    if choice is None:
        raise ValueError("the provider returned no choices")
    msg = choice.message
    result.content = msg.content or ""
    result.tool_calls = _parse_tool_calls(msg.tool_calls)
    result.assistant_message = msg.model_dump(exclude_none=True, exclude_unset=True)
    result.assistant_message.setdefault("role", "assistant")
    usage = response.usage
    if usage is not None:
        result.prompt_tokens = usage.prompt_tokens or 0
        result.completion_tokens = usage.completion_tokens or 0
        details = getattr(usage, "prompt_tokens_details", None)
        result.cached_tokens = (getattr(details, "cached_tokens", 0) or 0) if details else 0


# What a failed call looks like on the result (and in the ledger): provider trouble never raises.
_CALL_ERRORS = (openai.OpenAIError, ValueError, AttributeError, TypeError)


def _failed(exc: Exception, result: LLMResult, timeout: float) -> None:
    if isinstance(exc, openai.APITimeoutError):
        result.error = f"timeout after {timeout:g}s"
        result.timed_out = True
    elif isinstance(exc, openai.APIStatusError):
        result.error = f"HTTP {exc.status_code}: {str(exc)[:500]}"
    else:
        result.error = f"{type(exc).__name__}: {str(exc)[:500]}"


def _finish(result: LLMResult, started: float, purpose: str, model: str) -> None:
    result.latency_ms = int((time.perf_counter() - started) * 1000)
    if result.error:
        logger.warning("LLM call (%s, %s) failed: %s", purpose, model, result.error)


async def complete(
    *,
    purpose: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    session_id: int | None = None,
    cycle_id: int | None = None,
    timeout: float | None = None,
) -> LLMResult:
    """One chat-completions call. Never raises for provider trouble: the error is on the result and
    in the ledger, so callers can record it and go on."""
    cfg = get_config()
    kwargs = _request(cfg, messages, tools, timeout)
    result = LLMResult()
    started = time.perf_counter()
    try:
        _read(await get_client(cfg).chat.completions.create(**kwargs), result)
    except _CALL_ERRORS as exc:
        _failed(exc, result, kwargs["timeout"])
    _finish(result, started, purpose, cfg.llm_model)
    result.call_id = await sync_to_async(_record)(
        purpose=purpose, model=cfg.llm_model, result=result, session_id=session_id, cycle_id=cycle_id
    )
    return result


def complete_sync(
    *,
    purpose: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    session_id: int | None = None,
    cycle_id: int | None = None,
    timeout: float | None = None,
    hard_timeout: bool = False,
) -> LLMResult:
    """`complete` for sync worker code (django-q2 tasks), with the SDK's sync client: the same
    request, the same ledger row. With `hard_timeout` the SDK does not retry, so `timeout` bounds
    the whole call (a retry would start the clock again)."""
    cfg = get_config()
    kwargs = _request(cfg, messages, tools, timeout)
    result = LLMResult()
    started = time.perf_counter()
    try:
        client = get_sync_client(cfg)
        if hard_timeout:
            client = client.with_options(max_retries=0)
        _read(client.chat.completions.create(**kwargs), result)
    except _CALL_ERRORS as exc:
        _failed(exc, result, kwargs["timeout"])
    _finish(result, started, purpose, cfg.llm_model)
    result.call_id = _record(
        purpose=purpose, model=cfg.llm_model, result=result, session_id=session_id, cycle_id=cycle_id
    )
    return result
