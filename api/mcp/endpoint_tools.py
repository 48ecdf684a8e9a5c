"""What the bot's MCP endpoint offers a token: its tools and resources, each a sync function over the
same services as the proactive API (api.messages, api.targets) and the life loop's memory and timers.

A call is one transaction: a refusal (ApiError, LifeError) undoes every write it made and comes back
as {"code", "message", "field"?} with the API's codes (or the memory and timer services' codes). Writing
message tools take an `idempotency_key`, with the API's Idempotency-Key semantics.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from pydantic import BaseModel, ValidationError

from api.access import (
    idempotent_call,
    rate_limit_hit,
    request_fingerprint,
    token_conversations,
    token_is_bounded,
    token_may_reach,
    token_require,
)
from api.errors import ApiError, ApiErrorCode
from api.http import (
    ConversationFilters,
    ConversationOut,
    MessageFilters,
    MessageOut,
    PageParams,
)
from api.mcp.arguments import (
    CancelMessageArgs,
    CancelTimerArgs,
    ForgetArgs,
    InnerStateArgs,
    ListConversationsArgs,
    ListMessagesArgs,
    MessageIdArgs,
    NoArgs,
    RememberArgs,
    SendMessageArgs,
    SetTimerArgs,
    WhereArgs,
)
from api.messages import (
    Origin,
    proactive_message_as_dict,
    proactive_message_cancel,
    proactive_message_from,
    proactive_message_get,
    proactive_messages_as_dicts,
    proactive_messages_list,
)
from api.models import McpEndpointCall
from api.targets import conversation_as_dict, conversations_list
from chat.models import ApiScope, ApiToken, ChatSession, ChatType, Direction, Message
from core.config import format_instant, get_config
from scheduling.life.error_codes import LifeError
from scheduling.life.memory import (
    inner_state_get,
    inner_state_update,
    memory_slot_forget,
    memory_slot_set,
    memory_slots_for,
)
from scheduling.life.timers import timer_as_dict, timer_cancel, timer_create, timers_active
from scheduling.models import Actor
from scheduling.services import ActedBy

Code = ApiErrorCode
# How many recent messages the conversation history resource shows.
HISTORY_MESSAGES = 50

Result = dict[str, Any]


# --- shapes -----------------------------------------------------------------------------------------


def _json_ready(shape: type[BaseModel], value: dict[str, Any]) -> Result:
    # The API's own output shapes: the same fields, times as ISO 8601 with offset.
    return shape.model_validate(value).model_dump(mode="json")


def _message(task: Any) -> Result:
    return _json_ready(MessageOut, proactive_message_as_dict(task))


def _conversation(session: ChatSession) -> Result:
    return _json_ready(ConversationOut, conversation_as_dict(session))


def _page(qs, args: PageParams, render_all: Callable[[list], list]) -> Result:
    count = qs.count()
    nxt = args.offset + args.limit
    return {
        "count": count,
        "limit": args.limit,
        "offset": args.offset,
        "next_offset": nxt if nxt < count else None,
        "items": render_all(list(qs[args.offset : nxt])),
    }


def _instant(value: datetime | None) -> str | None:
    return format_instant(value, get_config().tzinfo) if value is not None else None


def _acted_by(token: ApiToken) -> ActedBy:
    return ActedBy(via=Actor.API, token=token, origin=Origin.MCP)


def _global_allowed(token: ApiToken, what: str, *, field: str | None = None) -> None:
    """Refuse (forbidden_conversation) a token bound to channels or conversations anything global: the
    bot's own memory, timers and inner state belong to no conversation."""
    if token_is_bounded(token):
        raise ApiError(Code.FORBIDDEN_CONVERSATION, f"this token is limited to some conversations; {what}", field=field)


def _where(token: ApiToken, conversation_id: str | None) -> ChatSession | None:
    """The conversation a memory or timer call is about (None: the bot's own), if the token may reach it."""
    if conversation_id is None:
        _global_allowed(token, "name one with conversation_id", field="conversation_id")
        return None
    session = ChatSession.objects.filter(session_id=conversation_id).first()
    if session is None:
        raise ApiError(Code.CONVERSATION_NOT_FOUND, f"no conversation {conversation_id!r}", field="conversation_id")
    token_may_reach(token, channel=session.platform, conversation_id=session.session_id)
    return session


def _slot(slot: Any) -> Result:
    return {"key": slot.key, "content": slot.content, "updated_at": _instant(slot.updated_at)}


# --- tools ------------------------------------------------------------------------------------------


def send_message(token: ApiToken, args: SendMessageArgs) -> Result:
    task = proactive_message_from(token, Origin.MCP, args)
    return _message(task)


def get_message(token: ApiToken, args: MessageIdArgs) -> Result:
    return _message(proactive_message_get(token=token, message_id=args.message_id))


def list_messages(token: ApiToken, args: ListMessagesArgs) -> Result:
    filters = args.model_dump(include=set(MessageFilters.model_fields))
    qs = proactive_messages_list(token=token, **filters)
    return _page(qs, args, lambda tasks: [_json_ready(MessageOut, d) for d in proactive_messages_as_dicts(tasks)])


def cancel_message(token: ApiToken, args: CancelMessageArgs) -> Result:
    return _message(proactive_message_cancel(token=token, message_id=args.message_id, reason=args.reason or ""))


def list_conversations(token: ApiToken, args: ListConversationsArgs) -> Result:
    filters = args.model_dump(include=set(ConversationFilters.model_fields))
    return _page(conversations_list(token=token, **filters), args, lambda rows: [_conversation(s) for s in rows])


def get_inner_state(token: ApiToken, args: NoArgs) -> Result:
    token_require(token, ApiScope.INNER_STATE)
    _global_allowed(token, "the inner state is the bot's own, of no conversation")
    state = inner_state_get()
    return {"text": state.text, "updated_at": _instant(state.updated_at), "updated_by": state.updated_by}


def update_inner_state(token: ApiToken, args: InnerStateArgs) -> Result:
    token_require(token, ApiScope.INNER_STATE)
    _global_allowed(token, "the inner state is the bot's own, of no conversation")
    state = inner_state_update(text=args.text, via="mcp")
    return {"text": state.text, "updated_at": _instant(state.updated_at), "updated_by": state.updated_by}


def list_memory(token: ApiToken, args: WhereArgs) -> Result:
    token_require(token, ApiScope.MEMORY)
    session = _where(token, args.conversation_id)
    global_slots, own = memory_slots_for(session)
    if session is not None and token_is_bounded(token):
        global_slots = []  # a limited token sees only the conversations it may reach
    return {
        "global": [_slot(s) for s in global_slots],
        "conversation": [_slot(s) for s in own] if session is not None else None,
    }


def remember(token: ApiToken, args: RememberArgs) -> Result:
    token_require(token, ApiScope.MEMORY)
    session = _where(token, args.conversation_id)
    slot, created = memory_slot_set(key=args.key, content=args.content, session=session, via="mcp")
    return {**_slot(slot), "conversation_id": args.conversation_id, "created": created}


def forget(token: ApiToken, args: ForgetArgs) -> Result:
    token_require(token, ApiScope.MEMORY)
    session = _where(token, args.conversation_id)
    memory_slot_forget(key=args.key, session=session)
    return {"key": args.key.strip(), "conversation_id": args.conversation_id, "forgotten": True}


def list_timers(token: ApiToken, args: WhereArgs) -> Result:
    token_require(token, ApiScope.TIMERS)
    session = _where(token, args.conversation_id)
    timers = [timer_as_dict(t) for t in timers_active(session=session)]
    return {"conversation_id": args.conversation_id, "timers": timers}


def set_timer(token: ApiToken, args: SetTimerArgs) -> Result:
    token_require(token, ApiScope.TIMERS)
    session = _where(token, args.conversation_id)
    timer = timer_create(
        spec=args.spec, label=args.label, payload=args.payload, session=session, acted_by=_acted_by(token)
    )
    return {"conversation_id": args.conversation_id, **timer_as_dict(timer)}


def cancel_timer(token: ApiToken, args: CancelTimerArgs) -> Result:
    token_require(token, ApiScope.TIMERS)
    session = _where(token, args.conversation_id)
    timer = timer_cancel(timer_id=args.timer_id.strip(), session=session, acted_by=_acted_by(token))
    return {"conversation_id": args.conversation_id, **timer_as_dict(timer)}


@dataclass(frozen=True)
class EndpointTool:
    name: str
    description: str
    arguments: type[BaseModel]
    run: Callable[[ApiToken, Any], Result]
    # A token is offered the tool when it has one of these scopes (the tool checks exactly what it needs).
    scopes: tuple[ApiScope, ...]
    # Writes that take an idempotency_key (replayed per token and key, as the API's Idempotency-Key).
    idempotent: bool = False
    read_only: bool = False
    # About the bot as a whole (its inner state): never offered to a token bound to some conversations.
    global_only: bool = False

    def input_schema(self) -> dict[str, Any]:
        return self.arguments.model_json_schema()


READ = (ApiScope.READ_OWN, ApiScope.READ_ALL)
TOOLS: dict[str, EndpointTool] = {
    t.name: t
    for t in [
        EndpointTool(
            "send_message",
            "Send a message to a conversation now, or at send_at. Name the conversation with exactly one anchor: "
            "conversation_id, or channel_type with channel_thread_id (a group the bot knows) or channel_user_id "
            "(a private chat, created when new). Returns the message and what became of it.",
            SendMessageArgs,
            send_message,
            (ApiScope.SEND,),
            idempotent=True,
        ),
        EndpointTool(
            "get_message",
            "A message this token may read (sent or scheduled through the API or MCP) and its delivery.",
            MessageIdArgs,
            get_message,
            READ,
            read_only=True,
        ),
        EndpointTool(
            "list_messages",
            "Messages this token may read, newest first; filter by status, conversation, origin and times.",
            ListMessagesArgs,
            list_messages,
            READ,
            read_only=True,
        ),
        EndpointTool(
            "cancel_message",
            "Cancel a pending (scheduled, not yet sent) message this token may read.",
            CancelMessageArgs,
            cancel_message,
            (ApiScope.CANCEL,),
            idempotent=True,
        ),
        EndpointTool(
            "list_conversations",
            "The conversations this token may send to, most recently active first (find a conversation_id).",
            ListConversationsArgs,
            list_conversations,
            (ApiScope.SEND,),
            read_only=True,
        ),
        EndpointTool(
            "get_inner_state",
            "The bot's inner state (its mood and intentions, kept by its life loop).",
            NoArgs,
            get_inner_state,
            (ApiScope.INNER_STATE,),
            read_only=True,
            global_only=True,
        ),
        EndpointTool(
            "update_inner_state",
            "Replace the bot's inner state; the previous text is kept as a revision.",
            InnerStateArgs,
            update_inner_state,
            (ApiScope.INNER_STATE,),
            global_only=True,
        ),
        EndpointTool(
            "list_memory",
            "The bot's memory slots: global ones, and a conversation's when conversation_id is given.",
            WhereArgs,
            list_memory,
            (ApiScope.MEMORY,),
            read_only=True,
        ),
        EndpointTool(
            "remember",
            "Keep a short fact under a key, globally or about one conversation; an existing key is replaced.",
            RememberArgs,
            remember,
            (ApiScope.MEMORY,),
        ),
        EndpointTool(
            "forget",
            "Remove a memory slot, globally or from one conversation.",
            ForgetArgs,
            forget,
            (ApiScope.MEMORY,),
        ),
        EndpointTool(
            "list_timers",
            "Active timers, soonest first: the bot's own, or a conversation's when conversation_id is given.",
            WhereArgs,
            list_timers,
            (ApiScope.TIMERS,),
            read_only=True,
        ),
        EndpointTool(
            "set_timer",
            "Set a timer that wakes the bot's life loop (for a conversation, or the bot's own).",
            SetTimerArgs,
            set_timer,
            (ApiScope.TIMERS,),
        ),
        EndpointTool(
            "cancel_timer",
            "Cancel an active timer (within conversation_id when given).",
            CancelTimerArgs,
            cancel_timer,
            (ApiScope.TIMERS,),
        ),
    ]
}


def tools_for(token: ApiToken) -> list[EndpointTool]:
    """The tools a token is offered: those it has a scope for (a token bound to some conversations: but
    the global ones, which it would be refused)."""
    bounded = token_is_bounded(token)
    return [t for t in TOOLS.values() if any(s in token.scopes for s in t.scopes) and not (bounded and t.global_only)]


def request_token(*, token_id: int) -> ApiToken:
    """The token of an MCP request (a tool call, listing tools, resources or templates, reading a
    resource), each counted against the token's rate limit. Raises ApiError: token_revoked, rate_limited."""
    token = ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).first()
    if token is None:
        raise ApiError(Code.TOKEN_REVOKED, "this token has been revoked")
    wait = rate_limit_hit(token=token)
    if wait is not None:
        raise ApiError(Code.RATE_LIMITED, f"too many requests for this token; retry in {wait} s")
    return token


def _validation_error(exc: ValidationError) -> ApiError:
    errors = [
        {
            "field": ".".join(str(p) for p in e.get("loc", ())) or "arguments",
            "message": str(e.get("msg", "invalid")),
            "type": str(e.get("type", "")),
        }
        for e in exc.errors(include_url=False, include_input=False)
    ]
    first = errors[0] if errors else {"field": "arguments", "message": "invalid"}
    return ApiError(Code.VALIDATION_ERROR, f"{first['field']}: {first['message']}", field=first["field"], errors=errors)


# Endpoint calls kept for the admin (the newest).
KEEP_CALLS = 10_000


def tool_call(*, token_id: int, name: str, arguments: dict[str, Any] | None) -> tuple[bool, Result]:
    """Run one tool call for a token (sync; one transaction) and record it. Returns (ok, result or
    error dict)."""
    started = time.monotonic()
    ok, result = _tool_call(token_id=token_id, name=name, arguments=arguments)
    row = McpEndpointCall.objects.create(
        token_id=token_id,
        tool=name[:128],
        ok=ok,
        error_code="" if ok else str(result.get("code", ""))[:64],
        duration_ms=(time.monotonic() - started) * 1000,
    )
    if row.pk % 100 == 0:
        McpEndpointCall.objects.filter(pk__lte=row.pk - KEEP_CALLS).delete()
    return ok, result


def _tool_call(*, token_id: int, name: str, arguments: dict[str, Any] | None) -> tuple[bool, Result]:
    try:
        token = request_token(token_id=token_id)
    except ApiError as exc:
        return False, exc.as_dict()
    tool = TOOLS.get(name)
    if tool is None:
        return False, {"code": "unknown_tool", "message": f"no tool {name!r}; list_tools says what there is"}
    try:
        args = tool.arguments.model_validate(arguments or {})
    except ValidationError as exc:
        return False, _validation_error(exc).as_dict()
    try:
        if tool.idempotent:
            key = getattr(args, "idempotency_key", None)
            body = json.dumps({k: v for k, v in (arguments or {}).items() if k != "idempotency_key"}).encode()
            fingerprint = request_fingerprint(method="MCP", path=name, body=body)
            status, result = idempotent_call(
                token=token, key=key, fingerprint=fingerprint, operation=lambda: (200, tool.run(token, args))
            )
            if status >= 400:
                return False, {k: result[k] for k in ("code", "message", "field", "errors") if k in result}
            return True, result
        with transaction.atomic():
            return True, tool.run(token, args)
    except ApiError as exc:
        return False, exc.as_dict()
    except LifeError as exc:
        return False, exc.as_dict()


# --- resources --------------------------------------------------------------------------------------

CONVERSATIONS_URI = "maibot://conversations"
HISTORY_TEMPLATE = "maibot://conversations/{conversation_id}/messages"


def conversations_resource(*, token: ApiToken) -> Result:
    """The conversations the token may send to (the first 100), as list_conversations shows them."""
    qs = conversations_list(token=token)
    return {"items": [_conversation(s) for s in qs[:100]], "count": qs.count()}


def history_resource(*, token: ApiToken, conversation_id: str) -> Result:
    """A conversation's recent messages, oldest first."""
    token_require(token, ApiScope.HISTORY)
    session = _where(token, conversation_id)
    rows = list(Message.objects.filter(session=session).order_by("-time", "-id")[:HISTORY_MESSAGES])
    bot = get_config().bot.nickname
    return {
        "conversation": _conversation(session),
        "messages": [
            {
                "time": _instant(m.time),
                "from": bot if m.direction == Direction.OUT else (m.sender_nickname or m.sender_id),
                "sender_id": None if m.direction == Direction.OUT else m.sender_id,
                "direction": m.direction,
                "text": m.text,
            }
            for m in reversed(rows)
        ],
        "group": session.chat_type == ChatType.GROUP,
    }


def history_conversations(*, token: ApiToken) -> list[ChatSession]:
    """The conversations whose history the token may read (for the resource list), the first 100."""
    if ApiScope.HISTORY not in token.scopes:
        return []
    return list(ChatSession.objects.filter(token_conversations(token)).order_by("-last_active_at", "-pk")[:100])
