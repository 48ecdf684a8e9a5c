"""The capabilities a plugin calls (`ctx.<capability>.<method>(...)` → `rpc_call("cap.call", plugin_id,
{"capability": ..., "args": {...}})`), answered with our data and services.

Answered: send.text (through the one send service), config.get (our bot_config, dotted keys),
message.get_recent, message.get_by_id, llm.generate (our LLM client: routing, budgets and the ledger,
task `utility`), chat.get_all_streams, chat.get_group_streams, chat.get_private_streams,
chat.get_stream_by_group_id, chat.get_stream_by_user_id. A stream id is our ChatSession.session_id
(stable: derived from platform, chat type and user or group id). As in MaiBot, a plugin may call only
the capabilities its manifest declares; anything else, and every capability we do not answer, raises
RuntimeError in the plugin with the reason ("... is not supported by this host"), as MaiBot's runner
raises on an error answer. Every call has a timeout (30 s, or the call's `timeout_ms`, at most 300 s).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connections
from pydantic import BaseModel

if TYPE_CHECKING:
    from plugins.records import PluginRecord

logger = logging.getLogger(__name__)

MAX_TEXT = 10_000  # characters one send.text may carry
MAX_RECENT = 200  # messages one message.get_recent may return
MAX_PROMPT_CHARS = 200_000
MAX_CAPABILITY_TIMEOUT = 300.0
DEFAULT_CAPABILITY_TIMEOUT = 30.0
# Keys config.get never answers, whatever section they are in.
_SECRET_WORDS = ("api_key", "secret", "token", "password")

Capability = Callable[["PluginRecord", dict[str, Any]], Awaitable[Any]]


async def _db(fn: Callable[[], Any]) -> Any:
    """Run ORM work in a worker thread (the plugins' loop never touches the database itself)."""

    def run() -> Any:
        try:
            return fn()
        finally:
            connections.close_all()

    return await asyncio.to_thread(run)


def _send_result(args: dict[str, Any], sent: bool, error: str = "") -> dict[str, Any]:
    result: dict[str, Any] = {"success": sent}
    if args.get("return_details"):
        # The platform's message id is known only once the adapter echoes it.
        result.update({"sent": sent, "message_id": None})
    if error:
        result["error"] = error
    return result


def _stream(session) -> dict[str, Any]:
    group = not session.is_private
    return {
        "session_id": session.session_id,
        "stream_id": session.session_id,
        "platform": session.platform,
        "user_id": session.user_id,
        "user_nickname": session.user_nickname,
        "user_cardname": session.user_cardname,
        "group_id": session.group_id,
        "group_name": session.group_name,
        "account_id": "",
        "scope": "",
        "is_group_session": group,
        "chat_type": "group" if group else "private",
    }


def _message(message, session) -> dict[str, Any]:
    return {
        "message_id": message.platform_message_id or str(message.uid),
        "timestamp": str(message.time.timestamp()),
        "time": message.time.isoformat(),
        "platform": session.platform,
        "message_info": {
            "user_info": {
                "platform": session.platform,
                "user_id": message.sender_id,
                "user_nickname": message.sender_nickname,
                "user_cardname": message.sender_cardname,
            },
            "group_info": None
            if session.is_private
            else {"platform": session.platform, "group_id": session.group_id, "group_name": session.group_name},
            "additional_config": {},
        },
        "raw_message": list(message.segments) if isinstance(message.segments, list) else [],
        "processed_plain_text": message.text,
        "display_message": message.text,
        "session_id": session.session_id,
        "chat_id": session.session_id,
        "is_bot_message": message.direction == "out",
        "reply_to": message.reply_to_platform_id or None,
    }


def _session(stream_id: str):
    from chat.models import ChatSession

    return ChatSession.objects.filter(session_id=stream_id).first() if stream_id else None


def _text_problem(text: str) -> str:
    if not text.strip():
        return "text is empty"
    if len(text) > MAX_TEXT:
        return f"text is longer than {MAX_TEXT} characters"
    if "\x00" in text:
        return "text contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text is not valid Unicode (an unpaired surrogate)"
    return ""


# --- send -------------------------------------------------------------------------------------------


async def send_text(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.models import SourceKind
    from chat.services import message_send

    text = args.get("text")
    stream_id = str(args.get("stream_id") or "")
    if not isinstance(text, str) or not stream_id:
        return _send_result(args, False, "send.text needs text (a string) and stream_id")
    if problem := _text_problem(text):
        return _send_result(args, False, problem)

    def send() -> str:
        session = _session(stream_id)
        if session is None:
            return f"there is no chat with stream_id {stream_id}"
        message_send(
            session=session,
            source_kind=SourceKind.REPLY,
            text=text,
            extra={"plugin": record.plugin_id, "capability": "send.text"},
        )
        return ""

    error = await _db(send)
    return _send_result(args, not error, error)


# --- config ----------------------------------------------------------------------------------------


async def config_get(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from maibot.config import get_config

    key = str(args.get("key") or "").strip()
    default = args.get("default")
    if not key or len(key) > 200:
        return {"success": False, "value": default, "error": "config.get needs a key (dotted, e.g. bot.nickname)"}
    if any(word in key.lower() for word in _SECRET_WORDS):
        return {"success": False, "value": default, "error": f"config key {key} is not readable by plugins"}
    value: Any = get_config()
    for part in key.split("."):
        if isinstance(value, dict):
            if part not in value:
                return {"success": True, "value": default}
            value = value[part]
        elif isinstance(value, BaseModel) and part in type(value).model_fields:
            value = getattr(value, part)
        else:
            return {"success": True, "value": default}
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, list):
        value = [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
    return {"success": True, "value": value}


# --- messages ----------------------------------------------------------------------------------------


async def message_get_recent(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    stream_id = str(args.get("chat_id") or args.get("stream_id") or "")
    try:
        limit = int(args.get("limit", 10))
    except (TypeError, ValueError):
        return {"success": False, "messages": [], "error": "limit must be an integer"}
    limit = max(1, min(limit, MAX_RECENT))

    def read() -> dict[str, Any]:
        session = _session(stream_id)
        if session is None:
            return {"success": False, "messages": [], "error": f"there is no chat with stream_id {stream_id}"}
        rows = list(session.messages.order_by("-time", "-pk")[:limit])
        return {"success": True, "messages": [_message(m, session) for m in reversed(rows)]}

    return await _db(read)


async def message_get_by_id(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    import uuid

    from chat.models import Message

    message_id = str(args.get("message_id") or "").strip()
    stream_id = str(args.get("stream_id") or args.get("chat_id") or "")
    if not message_id:
        return {"success": False, "message": None, "error": "message.get_by_id needs message_id"}

    def read() -> dict[str, Any]:
        rows = Message.objects.select_related("session")
        if stream_id:
            rows = rows.filter(session__session_id=stream_id)
        found = rows.filter(platform_message_id=message_id).order_by("-pk").first()
        if found is None:
            try:
                found = rows.filter(uid=uuid.UUID(message_id)).first()
            except ValueError:
                found = None
        return {"success": True, "message": _message(found, found.session) if found else None}

    return await _db(read)


# --- chats -------------------------------------------------------------------------------------------


def _platform(args: dict[str, Any]) -> str:
    return str(args.get("platform") or "qq")


async def _streams(args: dict[str, Any], chat_type: str | None) -> dict[str, Any]:
    from chat.models import ChatSession

    platform = _platform(args)

    def read() -> dict[str, Any]:
        rows = ChatSession.objects.order_by("pk")
        if platform != "all_platforms":
            rows = rows.filter(platform=platform)
        if chat_type:
            rows = rows.filter(chat_type=chat_type)
        return {"success": True, "streams": [_stream(s) for s in rows[:10_000]]}

    return await _db(read)


async def chat_get_all_streams(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return await _streams(args, None)


async def chat_get_group_streams(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return await _streams(args, "group")


async def chat_get_private_streams(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return await _streams(args, "private")


async def _one_stream(args: dict[str, Any], chat_type: str, key: str) -> dict[str, Any]:
    from chat.models import ChatSession, make_session_id

    target = str(args.get(key) or "").strip()
    if not target:
        return {"success": False, "stream": None, "error": f"{key} is required"}
    session_id = make_session_id(_platform(args), chat_type, target)

    def read() -> dict[str, Any]:
        session = ChatSession.objects.filter(session_id=session_id).first()
        return {"success": True, "stream": _stream(session) if session else None}

    return await _db(read)


async def chat_get_stream_by_group_id(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return await _one_stream(args, "group", "group_id")


async def chat_get_stream_by_user_id(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    return await _one_stream(args, "private", "user_id")


# --- llm ---------------------------------------------------------------------------------------------


def _prompt_messages(prompt: Any) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        messages = []
        for m in prompt:
            role, content = m.get("role"), m.get("content")
            if role not in ("system", "user", "assistant") or not isinstance(content, str):
                raise ValueError("each prompt message needs a role (system, user, assistant) and text content")
            messages.append({"role": role, "content": content})
    else:
        raise ValueError("prompt must be a string or a list of {role, content} messages")
    if sum(len(m["content"]) for m in messages) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt is longer than {MAX_PROMPT_CHARS} characters")
    if not any(m["content"].strip() for m in messages):
        raise ValueError("the prompt is empty")
    return messages


async def llm_generate(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.agent import llm

    try:
        messages = _prompt_messages(args.get("prompt"))
    except ValueError as exc:
        return {"success": False, "response": "", "reasoning": "", "model_name": "", "error": str(exc)}
    result = await llm.complete(purpose=f"plugin:{record.plugin_id}"[:32], messages=messages)
    payload = {
        "success": result.ok,
        "response": result.content,
        "reasoning": "",
        "model_name": result.model_name,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }
    if not result.ok:
        payload["error"] = result.error
    return payload


IMPLEMENTATIONS: dict[str, Capability] = {
    "send.text": send_text,
    "config.get": config_get,
    "message.get_recent": message_get_recent,
    "message.get_by_id": message_get_by_id,
    "chat.get_all_streams": chat_get_all_streams,
    "chat.get_group_streams": chat_get_group_streams,
    "chat.get_private_streams": chat_get_private_streams,
    "chat.get_stream_by_group_id": chat_get_stream_by_group_id,
    "chat.get_stream_by_user_id": chat_get_stream_by_user_id,
    "llm.generate": llm_generate,
}
SUPPORTED = frozenset(IMPLEMENTATIONS)


def _timeout(capability: str, args: dict[str, Any], timeout_ms: Any) -> float:
    # As MaiBot's runner: the call's own timeout, else rpc_timeout_ms / _timeout_ms / timeout_ms in
    # the arguments (render.html2png's timeout_ms is its render time, not the call's).
    if timeout_ms is None:
        for key in ("rpc_timeout_ms", "_timeout_ms", "timeout_ms"):
            if key == "timeout_ms" and capability == "render.html2png":
                continue
            if key in args:
                timeout_ms = args.pop(key)
                break
    if timeout_ms is None:
        return DEFAULT_CAPABILITY_TIMEOUT
    try:
        seconds = int(timeout_ms) / 1000
    except (TypeError, ValueError):
        raise ValueError(f"invalid timeout_ms: {timeout_ms!r}") from None
    if seconds <= 0:
        raise ValueError(f"timeout_ms must be positive: {timeout_ms!r}")
    return min(seconds, MAX_CAPABILITY_TIMEOUT)


def make_context(record: PluginRecord):
    """The PluginContext of one plugin: its rpc_call answers `cap.call` with IMPLEMENTATIONS."""
    from maibot_sdk import PluginContext, PluginPaths

    async def rpc_call(method: str, plugin_id: str = "", payload: dict[str, Any] | None = None, timeout_ms=None) -> Any:
        # Whatever id the caller names, the call is this plugin's (as in MaiBot's runner).
        if method != "cap.call":
            raise RuntimeError(f"host method {method} is not supported by this host")
        request = dict(payload or {})
        capability = str(request.get("capability") or "").strip()
        args = request.get("args")
        args = dict(args) if isinstance(args, dict) else {}
        timeout = _timeout(capability, args, timeout_ms)
        if capability not in record.declared_capabilities:
            raise RuntimeError(
                f"capability {capability or '(none)'} is not declared in plugin {record.plugin_id}'s manifest"
            )
        impl = IMPLEMENTATIONS.get(capability)
        if impl is None:
            raise RuntimeError(f"capability {capability} is not supported by this host")
        try:
            return await asyncio.wait_for(impl(record, args), timeout)
        except TimeoutError:
            record.error(f"capability {capability} timed out after {timeout:g}s")
            raise RuntimeError(f"capability {capability} did not answer within {timeout:g}s") from None
        except Exception as exc:
            logger.exception("plugin %s: capability %s failed", record.plugin_id, capability)
            record.error(f"capability {capability}: {type(exc).__name__}: {exc}"[:500])
            raise RuntimeError(f"capability {capability} failed: {exc}") from None

    base = Path(settings.DATA_DIR)
    paths = PluginPaths(
        data_dir=base / "plugin-data" / record.plugin_id, runtime_dir=base / "plugin-runtime" / record.plugin_id
    )
    return PluginContext(record.plugin_id, rpc_call=rpc_call, paths=paths)
