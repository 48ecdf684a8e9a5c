"""The one way to call a model: `AsyncOpenAI` against any OpenAI-compatible provider, every call
written to the LLMCall ledger (tokens, latency, cost, error)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import openai
from asgiref.sync import sync_to_async
from openai import AsyncOpenAI

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
    model = cfg.llm_model
    result = LLMResult()
    started = time.perf_counter()
    try:
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "temperature": cfg.llm.temperature,
            "timeout": timeout or cfg.llm.timeout,
        }
        if tools:
            kwargs["tools"] = tools
        response = await get_client(cfg).chat.completions.create(**kwargs)
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
    except openai.APITimeoutError:
        result.error = f"timeout after {timeout or cfg.llm.timeout:g}s"
    except openai.APIStatusError as exc:
        result.error = f"HTTP {exc.status_code}: {str(exc)[:500]}"
    except (openai.OpenAIError, ValueError, AttributeError, TypeError) as exc:
        result.error = f"{type(exc).__name__}: {str(exc)[:500]}"
    result.latency_ms = int((time.perf_counter() - started) * 1000)
    if result.error:
        logger.warning("LLM call (%s, %s) failed: %s", purpose, model, result.error)
    result.call_id = await sync_to_async(_record)(
        purpose=purpose, model=model, result=result, session_id=session_id, cycle_id=cycle_id
    )
    return result
