"""The one way to call a model: the openai SDK against any OpenAI-compatible provider, every call
written to the LLMCall ledger (tokens, latency, cost, error).

`complete` (AsyncOpenAI) serves async code (the chat planner); `complete_sync` (OpenAI) serves sync
worker code (life-loop turns, summaries), so sync code never wraps async code. Both carry out one
plan (`_route`: the task's models in order, each admitted under the caps, called, recorded; see
core.plans): only the call itself differs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from typing import TYPE_CHECKING, Any, Required, TypedDict, Unpack

from chat.agent import budget
from chat.models import LLMCall
from core.config import BotConfig, LLMModel, get_config
from core.plans import Plan, Step, run_async, run_sync

if TYPE_CHECKING:
    from openai import AsyncOpenAI, OpenAI

logger = logging.getLogger(__name__)


def _openai():
    """The openai SDK, imported at the first model call: it is a third of every process's start-up
    (servers, clusters and commands that never call a model do not pay for it)."""
    import openai

    return openai


# One client per event loop and provider settings: the SDK's HTTP pool is bound to its loop.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple, AsyncOpenAI]] = weakref.WeakKeyDictionary()


def _default_model(cfg: BotConfig) -> LLMModel:
    route = cfg.llm_route("utility")
    if route:
        return route[0]
    return LLMModel(
        name="", base_url=cfg.llm_base_url, api_key=cfg.llm_api_key, model="", price_input_per_1m=0,
        price_output_per_1m=0, timeout=cfg.llm.timeout, max_concurrent=0,
    )  # fmt: skip


def get_client(cfg: BotConfig | None = None, model: LLMModel | None = None) -> AsyncOpenAI:
    cfg = cfg or get_config()
    model = model or _default_model(cfg)
    key = (model.base_url, model.api_key, cfg.llm.max_retries)
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    client = per_loop.get(key)
    if client is None:
        client = _openai().AsyncOpenAI(base_url=model.base_url, api_key=model.api_key, max_retries=cfg.llm.max_retries)
        per_loop[key] = client
    return client


# One sync client per provider settings, shared by the worker's threads (its HTTP pool is thread-safe).
_sync_clients: dict[tuple, OpenAI] = {}
_sync_lock = threading.Lock()


def get_sync_client(cfg: BotConfig | None = None, model: LLMModel | None = None) -> OpenAI:
    cfg = cfg or get_config()
    model = model or _default_model(cfg)
    key = (model.base_url, model.api_key, cfg.llm.max_retries)
    with _sync_lock:
        client = _sync_clients.get(key)
        if client is None:
            client = _openai().OpenAI(base_url=model.base_url, api_key=model.api_key, max_retries=cfg.llm.max_retries)
            _sync_clients[key] = client
    return client


# Calls in flight per model in this process (`max_concurrent`): threads in sync code, tasks per loop.
_sync_gates: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_async_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, int], asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _sync_gate(model: LLMModel) -> threading.BoundedSemaphore | contextlib.nullcontext:
    if not model.max_concurrent:
        return contextlib.nullcontext()
    with _sync_lock:
        return _sync_gates.setdefault(
            (model.name, model.max_concurrent), threading.BoundedSemaphore(model.max_concurrent)
        )


def _async_gate(model: LLMModel) -> asyncio.Semaphore | contextlib.nullcontext:
    if not model.max_concurrent:
        return contextlib.nullcontext()
    per_loop = _async_gates.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault((model.name, model.max_concurrent), asyncio.Semaphore(model.max_concurrent))


@dataclass
class ToolCallRequest:
    """A tool call as the model asked for it. `arguments` is None when they were not valid JSON."""

    id: str
    name: str
    raw_arguments: str
    arguments: dict[str, Any] | None
    argument_error: str = ""
    # The result to record instead of running the call (a plugin hook withdrew it: chat.planner.hooks).
    refusal: dict[str, Any] | None = None


@dataclass
class LLMResult:
    content: str = ""
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    assistant_message: dict[str, Any] | None = None  # to append to the conversation for the next round
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    latency_ms: int = 0
    # Why the call failed, for the ledger, the planner's cycles and the logs: the kind, and at most the
    # provider's short error message (never the remote body: see _failed).
    error: str = ""
    # The error's kind alone ("HTTP 401", "timeout after 30s", "connection failed"), for the model tests.
    failure: str = ""
    timed_out: bool = False
    call_id: int | None = None
    model_name: str = ""  # the configured model that answered (or failed last)
    attempts: int = 0  # calls made: 1 + the fallbacks tried
    budget_exceeded: str = ""  # set when no call was made because a daily cap is reached: which, until when

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


def cost_of(prompt_tokens: int, completion_tokens: int, model: LLMModel | BotConfig | None = None) -> Decimal:
    """What a call cost at `model`'s prices (a BotConfig or None: the prices of [llm] itself)."""
    prices = model if isinstance(model, LLMModel) else (model or get_config()).llm
    cost = prompt_tokens * prices.price_input_per_1m / 1e6 + completion_tokens * prices.price_output_per_1m / 1e6
    return Decimal(str(round(cost, 6)))


def _record(
    *,
    purpose: str,
    model: LLMModel,
    attempt: int,
    result: LLMResult,
    session_id: int | None,
    cycle_id: int | None,
    admission: budget.Admission,
) -> int:
    """The ledger row of one call, and its spend charged to the caps it was admitted under."""
    cost = cost_of(result.prompt_tokens, result.completion_tokens, model)
    call = LLMCall.objects.create(
        purpose=purpose,
        task=budget.task_of(purpose),
        model=model.model,
        model_name=model.name,
        attempt=attempt,
        session_id=session_id,
        cycle_id=cycle_id,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        cached_tokens=result.cached_tokens,
        latency_ms=result.latency_ms,
        cost=cost,
        error=result.error[:2000],
    )
    budget.charge(admission=admission, tokens=result.prompt_tokens + result.completion_tokens, cost=cost)
    return call.pk


def _request(
    model: LLMModel,
    cfg: BotConfig,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    timeout: float,
) -> dict[str, Any]:
    """The chat-completions arguments (the same for the async and the sync client)."""
    kwargs: dict[str, Any] = {
        "model": model.model,
        "messages": messages,
        "temperature": cfg.llm.temperature,
        "timeout": timeout,
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
# LookupError: the SDK builds its answer without validating it, so `choices` may be any JSON value.
def _call_errors() -> tuple[type[Exception], ...]:
    return (_openai().OpenAIError, ValueError, LookupError, AttributeError, TypeError)


# The provider's own error message, shortened: enough to fix a key or a model name, too little to read
# another service through a base URL pointed at it.
PROVIDER_MESSAGE_MAX = 160


def _provider_message(exc: Exception) -> str:
    """The `message` field of a JSON error body (`{"error": {"message": ...}}` or a top-level
    `message`, as the openai SDK reads it), on one line and at most PROVIDER_MESSAGE_MAX characters;
    "" for any other body (text, HTML, JSON without that field)."""
    body = getattr(exc, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, str):
        return ""
    message = " ".join(message.split())
    return message if len(message) <= PROVIDER_MESSAGE_MAX else message[: PROVIDER_MESSAGE_MAX - 1] + "…"


def _connect_reason(exc: Exception) -> str:
    """Why a connection could not be made ("[Errno 111] Connection refused", a DNS or TLS error): the
    reason the local system gave while connecting, before the remote end sent any byte of an answer.
    Failures after that (a protocol error quotes the bytes it could not parse) give only their kind."""
    import httpx2  # the openai SDK's HTTP client

    cause = exc.__cause__
    if cause is None:
        return ""
    if isinstance(cause, httpx2.ConnectError):
        return " ".join(str(cause).split())[:PROVIDER_MESSAGE_MAX]
    return type(cause).__name__


def _failed(exc: Exception, result: LLMResult, timeout: float) -> None:
    """Fill `failure` (the kind: "HTTP 401", "timeout after 30s", "connection failed", "not a
    chat-completions answer") and `error` (the kind, and for an HTTP error the provider's own short
    message, for a connection the local reason). Neither ever holds the remote body: the ledger, the
    planner's cycles, the logs and the console show them to staff who may point a model at any URL."""
    openai = _openai()
    detail = ""
    if isinstance(exc, openai.APITimeoutError):
        result.failure = f"timeout after {timeout:g}s"
        result.timed_out = True
    elif isinstance(exc, openai.APIStatusError):
        result.failure = f"HTTP {exc.status_code}"
        detail = _provider_message(exc)
    elif isinstance(exc, openai.APIConnectionError):
        result.failure = "connection failed"
        detail = _connect_reason(exc)
    elif isinstance(exc, openai.OpenAIError):
        result.failure = type(exc).__name__
    else:  # _read found no chat-completions answer in what came back
        result.failure = "not a chat-completions answer"
    result.error = f"{result.failure}: {detail}" if detail else result.failure


def _finish(result: LLMResult, started: float, purpose: str, model: str) -> None:
    result.latency_ms = int((time.perf_counter() - started) * 1000)
    if result.error:
        logger.warning("LLM call (%s, %s) failed: %s", purpose, model, result.error)


def _admit(cfg: BotConfig, task: str, model: LLMModel, session_id: int | None) -> budget.Admission:
    return budget.admit(caps=budget.caps_for(cfg, task=task, model=model.name, session_id=session_id), cfg=cfg)


def _no_call(cfg: BotConfig, last: LLMResult | None, refusal: budget.Admission | None) -> LLMResult:
    """The result when no (further) call could be made: the last failure, else why none was made."""
    if last is not None:
        return last
    result = LLMResult()
    if refusal is not None:
        result.budget_exceeded = result.error = refusal.reason(cfg.tzinfo)
        logger.info("LLM call not made: %s", result.error)
    else:
        result.error = "no model is configured for this task"
    return result


def _attempt_timeout(model: LLMModel, timeout: float | None, left: float | None, *, first: bool) -> float:
    """One attempt's timeout: the model's own, within the caller's `timeout` (the first attempt may
    use all of it; a fallback what is left of it)."""
    limit = timeout if first or left is None else round(left, 3)
    return min(model.timeout, limit) if limit else model.timeout


class _Deadline:
    """`timeout` for the whole call, fallbacks included (None: each model's own timeout per attempt)."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.end = time.monotonic() + timeout if timeout else None

    def left(self) -> float | None:
        return None if self.end is None else self.end - time.monotonic()


def _ask(cfg: BotConfig, model: LLMModel, kwargs: dict[str, Any], *, retries: bool = True, gated: bool = True) -> Any:
    """One chat-completions request with the sync client (in this thread, within the model's gate)."""
    with _sync_gate(model) if gated else contextlib.nullcontext():
        client = get_sync_client(cfg, model)
        if not retries:
            client = client.with_options(max_retries=0)
        return client.chat.completions.create(**kwargs)


async def _aask(cfg: BotConfig, model: LLMModel, kwargs: dict[str, Any]) -> Any:
    """_ask() with the async client, on this loop."""
    async with _async_gate(model):
        return await get_client(cfg, model).chat.completions.create(**kwargs)


def _attempt(
    cfg: BotConfig, model: LLMModel, kwargs: dict[str, Any], result: LLMResult, purpose: str, **ask: bool
) -> Plan[None]:
    """One call to one model, its answer or its failure filled into `result` (the latency included)."""
    started = time.perf_counter()
    try:
        _read((yield Step(partial(_ask, cfg, model, kwargs, **ask), partial(_aask, cfg, model, kwargs))), result)
    except _call_errors() as exc:
        _failed(exc, result, kwargs["timeout"])
    _finish(result, started, purpose, model.model)


class LLMRequest(TypedDict, total=False):
    """What a model is asked (complete(), complete_sync()): the purpose (its task, routes and caps), the
    messages, the tools offered, the chat and cycle the ledger rows and caps belong to, a timeout."""

    purpose: Required[str]
    messages: Required[list[dict[str, Any]]]
    tools: list[dict[str, Any]] | None
    session_id: int | None
    cycle_id: int | None
    timeout: float | None


def _route(request: LLMRequest, *, whole: bool, retries: bool) -> Plan[LLMResult]:
    """The task's models in order, each admitted under the caps, called and recorded, until one
    answers (complete() and complete_sync() carry it out). `timeout` bounds each attempt, with `whole`
    the call as a whole too; `retries`: the SDK's own retries of an attempt."""
    if unknown := set(request) - set(LLMRequest.__annotations__):
        raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(unknown))}")
    purpose, messages, tools = request["purpose"], request["messages"], request.get("tools")
    session_id, cycle_id, timeout = request.get("session_id"), request.get("cycle_id"), request.get("timeout")
    cfg = get_config()
    task = budget.task_of(purpose)
    deadline = _Deadline(timeout if whole else None)
    last: LLMResult | None = None
    refusal: budget.Admission | None = None
    for attempt, model in enumerate(cfg.llm_route(task)):
        left = deadline.left()
        if left is not None and left <= 0:
            break
        admission = yield Step(partial(_admit, cfg, task, model, session_id))
        if not admission.admitted:
            refusal = admission if admission.refused_by.scope != "model" else (refusal or admission)
            if admission.refused_by.scope != "model":
                break  # the task's or the chat's cap: no model may be called
            continue
        kwargs = _request(model, cfg, messages, tools, _attempt_timeout(model, timeout, left, first=last is None))
        result = LLMResult(model_name=model.name, attempts=(last.attempts if last else 0) + 1)
        yield from _attempt(cfg, model, kwargs, result, purpose, retries=retries)
        result.call_id = yield Step(
            partial(_record, purpose=purpose, model=model, attempt=attempt, result=result, session_id=session_id,
                    cycle_id=cycle_id, admission=admission)
        )  # fmt: skip
        if result.ok:
            return result
        last = result
    return _no_call(cfg, last, refusal)


async def complete(**request: Unpack[LLMRequest]) -> LLMResult:
    """One chat-completions answer from the task's models (chat.agent.budget.task_of(purpose)): the first,
    then each fallback after a provider error or timeout, each attempt a ledger row. `timeout` bounds the
    whole call, fallbacks included (each attempt also within its model's own). Never raises for
    provider trouble: the error is on the result and in the ledger. A model whose daily cap is reached is
    skipped; when a task or session cap is reached, or every model's, no call is made
    (`result.budget_exceeded` says which cap and when it resets)."""
    return await run_async(_route(request, whole=True, retries=True))


def complete_sync(*, hard_timeout: bool = False, **request: Unpack[LLMRequest]) -> LLMResult:
    """`complete` for sync worker code (django-q2 tasks), with the SDK's sync client: the same
    requests, the same ledger rows, the same fallbacks and caps. `timeout` bounds each attempt, and
    with `hard_timeout` the whole call, fallbacks included: the SDK then does not retry (a retry would
    start the clock again)."""
    return run_sync(_route(request, whole=hard_timeout, retries=not hard_timeout))


# --- the model test (console) ---------------------------------------------------------------------

MODEL_TEST_TOOL = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Repeat a word back.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "description": "The word to repeat."}},
            "required": ["word"],
        },
    },
}
MODEL_TEST_PROMPT = "This is a connection test. Call the tool `echo` with the word `ping`, nothing else."
MODEL_TEST_TIMEOUT = 30.0


@dataclass
class ModelTest:
    """How one model's test call went, as the set-up page and the console show it: whether it
    answered, how long it took, whether it called the offered tool. Never what the remote end sent (the
    model's words, an error body): whoever may test a model may point it at any URL."""

    name: str
    model: str
    ok: bool
    latency_ms: int
    tool_calling: bool
    # "ok", else LLMResult.failure ("HTTP 401", "timeout after 30s", "connection failed", ...).
    outcome: str


def model_test(model: LLMModel) -> ModelTest:
    """One tiny call to `model` with one tool offered (no retries, at most MODEL_TEST_TIMEOUT seconds).
    Ledgered (purpose model_test, task utility) but not held to the budgets: an operator asked for it."""
    cfg = get_config()
    timeout = min(model.timeout, MODEL_TEST_TIMEOUT)
    kwargs = _request(model, cfg, [{"role": "user", "content": MODEL_TEST_PROMPT}], [MODEL_TEST_TOOL], timeout)
    result = LLMResult(model_name=model.name, attempts=1)
    run_sync(_attempt(cfg, model, kwargs, result, "model_test", retries=False, gated=False))
    result.call_id = _record(
        purpose="model_test",
        model=model,
        attempt=0,
        result=result,
        session_id=None,
        cycle_id=None,
        admission=budget.Admission(day=budget.local_day(budget.clock(), cfg.tzinfo), caps=[]),
    )
    calls = [c for c in result.tool_calls if c.name == "echo" and c.arguments is not None]
    return ModelTest(
        name=model.name,
        model=model.model,
        ok=result.ok,
        latency_ms=result.latency_ms,
        tool_calling=bool(calls) and str(calls[0].arguments.get("word", "")).strip().lower() == "ping",
        outcome="ok" if result.ok else result.failure or "failed",
    )
