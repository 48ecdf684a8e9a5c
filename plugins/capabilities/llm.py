"""llm.*: plugins' model calls go through our LLM client (chat.agent.llm), so routing, fallbacks,
budgets and the ledger apply: task `utility`, a ledger row with purpose `plugin:<id>`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from plugins.capabilities.common import db

if TYPE_CHECKING:
    from plugins.records import PluginRecord

MAX_PROMPT_CHARS = 200_000
MAX_TOOLS = 64
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PLUGIN_TASK = "utility"


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


def _tools(raw: Any) -> list[dict[str, Any]]:
    """A plugin's tool definitions as the OpenAI-style tools the model is offered: `{"type": "function",
    "function": {...}}` as it is, or MaiBot's flat `{"name", "description", "parameters"}`."""
    if not isinstance(raw, list) or not raw or len(raw) > MAX_TOOLS:
        raise ValueError(f"tools must be a list of 1 to {MAX_TOOLS} tool definitions")
    tools = []
    for tool in raw:
        spec = tool.get("function") if isinstance(tool, dict) and isinstance(tool.get("function"), dict) else tool
        if not isinstance(spec, dict) or not _TOOL_NAME.fullmatch(str(spec.get("name") or "")):
            raise ValueError("each tool needs a name of 1-64 letters, digits, _ or -")
        parameters = spec.get("parameters") if isinstance(spec.get("parameters"), dict) else {"type": "object"}
        function = {"name": spec["name"], "description": str(spec.get("description") or ""), "parameters": parameters}
        tools.append({"type": "function", "function": function})
    return tools


async def generate_with_tools(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """llm.generate_with_tools: as llm.generate, with `tools` offered (MaiBot 1.2's result, its
    `tool_calls` [{id, function: {name, arguments}}] included)."""
    try:
        tools = _tools(args.get("tools") or args.get("tool_options"))
    except ValueError as exc:
        return {"success": False, "response": "", "reasoning": "", "model_name": "", "error": str(exc)}
    return await generate(record, args, tools=tools)


async def generate(record: PluginRecord, args: dict[str, Any], *, tools: list | None = None) -> dict[str, Any]:
    from chat.agent import llm

    try:
        messages = _prompt_messages(args.get("prompt"))
    except ValueError as exc:
        return {"success": False, "response": "", "reasoning": "", "model_name": "", "error": str(exc)}
    # The sync client in a worker thread: the caller (a planner tool or command waiting on this plugin)
    # may hold asgiref's thread-sensitive executor, which the async client's ledger writes would need.
    purpose = f"plugin:{record.plugin_id}"[:32]
    result = await db(lambda: llm.complete_sync(purpose=purpose, messages=messages, tools=tools))
    payload = {
        "success": result.ok,
        "response": result.content,
        "reasoning": "",
        "model_name": result.model_name,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }
    if tools is not None:
        calls = [(c.id, {"name": c.name, "arguments": c.arguments or {}}) for c in result.tool_calls]
        payload["tool_calls"] = [{"id": call_id, "function": function} for call_id, function in calls]
    if not result.ok:
        payload["error"] = result.error
    return payload


async def get_available_models(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """The model task names a plugin may name, as MaiBot answers: here the one task plugins' calls run
    as (`utility`), when a model is routed to it (none: offline)."""
    from core.config import get_config

    return {"success": True, "models": [PLUGIN_TASK] if get_config().llm_route(PLUGIN_TASK) else []}


def _embed_texts(args: dict[str, Any]) -> tuple[str | None, list[str]]:
    """MaiBot's arguments: `text` (or `input`) one text, `texts` (or `inputs`) several, not both."""
    text = args.get("text") if args.get("text") is not None else args.get("input")
    text = text.strip() or None if isinstance(text, str) else None
    texts = args.get("texts") if args.get("texts") is not None else args.get("inputs")
    found: list[str] = []
    for index, item in enumerate(texts if isinstance(texts, list) else [], start=1):
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"texts 第 {index} 项必须为非空字符串")
        found.append(item.strip())
    return text, found


async def embed(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """llm.embed: embeddings from the models of `[llm] embedding` (chat.agent.embeddings: budgets, the
    ledger with purpose plugin:<id>). One `text` → {embedding, model_name}; `texts` → {results: [...]}.
    `task_name` / `model` are not honoured: the operator's embedding route decides."""
    from chat.agent.provider_calls import embed_sync

    try:
        text, texts = _embed_texts(args)
    except ValueError as exc:
        return {"success": False, "error": str(exc)}
    if text is None and not texts:
        return {"success": False, "error": "缺少必要参数 text 或 texts"}
    if text is not None and texts:
        return {"success": False, "error": "text 与 texts 只能提供一个"}
    purpose = f"plugin:{record.plugin_id}"[:32]
    result = await db(lambda: embed_sync(purpose=purpose, texts=[text] if text is not None else texts))
    if result.error:
        return {"success": False, "error": result.error}
    items = [{"embedding": vector, "model_name": result.model_name} for vector in result.vectors]
    return {"success": True, **items[0]} if text is not None else {"success": True, "results": items}


async def transcribe_audio(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    """llm.transcribe_audio: speech to text from the models of `[llm] voice` (chat.agent.provider_calls:
    budgets, the ledger with purpose plugin:<id>). MaiBot's arguments (`audio_base64`, `voice_base64` or
    `base64`, a data: URL too) and result ({success: the text is not empty, text, content}); audio up to
    10 MB. `task_name` / `model` are not honoured: the operator's voice route decides."""
    from chat.agent.provider_calls import transcribe_sync
    from chat.media import MediaError, decode_base64, sniff_mime

    encoded = next((str(args[k]).strip() for k in ("audio_base64", "voice_base64", "base64") if args.get(k)), "")
    if not encoded:
        return {"success": False, "error": "缺少必要参数 audio_base64 或 voice_base64"}
    try:
        audio = decode_base64(encoded)
    except MediaError as exc:
        return {"success": False, "error": f"audio_base64: {exc}"}
    extension = {"audio/mpeg": "mp3", "audio/ogg": "ogg", "audio/amr": "amr", "audio/silk": "silk"}
    filename = f"voice.{extension.get(sniff_mime(audio), 'wav')}"
    purpose = f"plugin:{record.plugin_id}"[:32]
    result = await db(lambda: transcribe_sync(purpose=purpose, audio=audio, filename=filename))
    if result.error:
        return {"success": False, "error": result.error}
    return {"success": bool(result.text), "text": result.text, "content": result.text}
