"""The proactive message HTTP API (/api/v1/): request and response shapes, auth, errors. HTTP only;
the target conversation is found by api.targets, the content built by api.content, the lifecycle
lives in api.messages; tokens, rate limit and idempotency in api.access.

Errors always have the shape {"code", "message", "field"?, "errors"?} with a code from
api.errors.ApiErrorCode. Every bad-input error, from the schema or from the anchor and content rules, is a
400 (one status for "fix your request"); the code says what is wrong and `field` where.
"""

from __future__ import annotations

import json
import threading
from datetime import datetime
from typing import Annotated, Any, Literal

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from ninja import Field, Header, NinjaAPI, Path, Query, Schema, Status, Swagger
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError
from ninja.security import HttpBearer
from ninja.throttling import BaseThrottle
from pydantic import ConfigDict, field_validator

from api.access import api_token_authenticate, idempotent_call, rate_limit_hit, request_fingerprint
from api.errors import ApiError, ApiErrorCode
from api.messages import (
    Origin,
    proactive_message_as_dict,
    proactive_message_cancel,
    proactive_message_from,
    proactive_message_get,
    proactive_messages_as_dicts,
    proactive_messages_list,
)
from api.targets import conversation_as_dict, conversations_list
from chat.fate import Fate
from chat.models import ApiToken, ChatType
from core.text import text_problem

Code = ApiErrorCode
# Beyond these, converting to UTC can overflow; nobody schedules a message there.
MIN_INSTANT = datetime(2000, 1, 1)
MAX_INSTANT = datetime(2999, 12, 31)


# --- auth and rate limit --------------------------------------------------------------------------


class BearerToken(HttpBearer):
    """`Authorization: Bearer <token>`, a token an operator created (admin or create_api_token)."""

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken:
        return api_token_authenticate(raw=token)  # raises ApiError (401) for a bad or revoked token


class TokenRateLimit(BaseThrottle):
    """api.rate_limit_per_minute requests per token and minute, counted in the database."""

    def __init__(self) -> None:
        # ninja asks wait() right after allow_request(); requests run in several threads.
        self._local = threading.local()

    def allow_request(self, request: HttpRequest) -> bool:
        self._local.wait = rate_limit_hit(token=request.auth)
        return self._local.wait is None

    def wait(self) -> float | None:
        return getattr(self._local, "wait", None)


class OfflineSwagger(Swagger):
    """Swagger UI rendered from django-ninja's own template and static files (settings.NINJA_DIR), never
    from a CDN: django-ninja takes the local files only when "ninja" is an installed app, which it is not
    here (its app module would import it into every process, the cluster's too)."""

    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        from django.shortcuts import render
        from ninja.openapi.docs import _csrf_needed

        self.settings["url"] = self.get_openapi_url(api, kwargs)
        context = {
            "swagger_settings": json.dumps(self.settings, indent=1),
            "api": api,
            "add_csrf": _csrf_needed(api),
        }
        return render(request, self.template, context)


api = NinjaAPI(
    title="maibot proactive message API",
    version="1.0.0",
    description=(
        "Send or schedule messages to a conversation the bot is in. Authenticate with "
        "`Authorization: Bearer <token>` (operators create tokens in the admin or with "
        "`manage.py create_api_token NAME`). Name the conversation with exactly one anchor: "
        "`conversation_id`, or `channel_type` with `channel_thread_id` (a group the bot knows) or "
        "`channel_user_id` (a private chat, created when new). Writing requests accept an "
        "`Idempotency-Key` header: a repeat with the same body gets the first answer and sends nothing."
    ),
    urls_namespace="api-v1",
    # Offline: Swagger UI comes from django-ninja's static files, and its online validator badge (a
    # request to validator.swagger.io) is switched off.
    docs=OfflineSwagger(settings={"validatorUrl": None, "persistAuthorization": True}),
    auth=BearerToken(),
    throttle=[TokenRateLimit()],
)


# --- schemas --------------------------------------------------------------------------------------


class InputSchema(Schema):
    """Every request shape: values the database cannot store are field errors, never a 500."""

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        if isinstance(value, str) and (problem := text_problem(value)):
            raise ValueError(problem)
        if isinstance(value, datetime) and not (MIN_INSTANT <= value.replace(tzinfo=None) <= MAX_INSTANT):
            raise ValueError("must be between the years 2000 and 2999")
        return value


class StrictSchema(InputSchema):
    # A misspelt field must be an error, not silently ignored (it may be the anchor).
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


class ImageIn(StrictSchema):
    base64: str | None = Field(None, description="The image bytes, base64 (a data: prefix is accepted).")
    url: str | None = Field(
        None,
        max_length=2048,
        description="An http(s) URL the adapter fetches (sent as an imageurl segment; this server never fetches it).",
    )


class SegmentIn(StrictSchema):
    type: Literal["text", "image", "mention"]
    text: str | None = Field(None, description="For type text.")
    base64: str | None = Field(None, description="For type image: base64 bytes (or give url).")
    url: str | None = Field(None, max_length=2048, description="For type image: an http(s) URL (or give base64).")
    user_id: str | None = Field(None, max_length=128, description="For type mention: whom to mention.")
    name: str | None = Field(None, max_length=255, description="For type mention: the name shown (default user_id).")


class AnchorIn(StrictSchema):
    """The conversation a request names: exactly one anchor (api.targets)."""

    conversation_id: str | None = Field(None, max_length=128, description="Anchor: our conversation id.")
    channel_type: str | None = Field(
        None, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$", description="The platform, e.g. qq."
    )
    channel_thread_id: str | None = Field(None, max_length=128, description="Anchor (with channel_type): a group id.")
    channel_user_id: str | None = Field(
        None, max_length=128, description="Anchor (with channel_type): a person; their private chat."
    )


class MessageIn(AnchorIn):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"channel_type": "qq", "channel_user_id": "10001", "text": "你好，记得开会 meeting at 3"},
                {
                    "channel_type": "qq",
                    "channel_thread_id": "555",
                    "type": "rich_text",
                    "segments": [
                        {"type": "mention", "user_id": "10001", "name": "Alice"},
                        {"type": "text", "text": "到你了"},
                    ],
                    "send_at": "2030-01-01T09:00:00+08:00",
                    "origin": "scheduler",
                },
            ]
        },
    )
    origin: Origin = Field(Origin.API, description="Who asks for this message; recorded on it.")
    type: Literal["text", "rich_text", "image"] = "text"
    text: str | None = Field(None, description="type text: the message; type image: an optional caption.")
    format: Literal["plain", "markdown"] = Field(
        "plain", description="type text only. QQ shows no markdown: it is sent as written and the format recorded."
    )
    segments: list[SegmentIn] | None = Field(None, description="type rich_text: text, image and mention segments.")
    image: ImageIn | None = Field(None, description="type image: the image, as base64 or url.")
    send_at: datetime | None = Field(
        None, description="ISO 8601 with offset. Absent: sent now, in this request. Else: delivered at that time."
    )

    @field_validator("origin")
    @classmethod
    def _not_mcp(cls, value: Origin) -> Origin:
        if value == Origin.MCP:
            raise ValueError("origin 'mcp' is recorded by the MCP endpoint only")
        return value


class CancelIn(StrictSchema):
    reason: str | None = Field(None, max_length=255, description="Why; shown with the message.")


class FieldErrorOut(Schema):
    field: str
    message: str
    type: str


class ErrorOut(Schema):
    code: ApiErrorCode
    message: str
    field: str | None = None
    errors: list[FieldErrorOut] | None = None


class ConversationOut(Schema):
    conversation_id: str
    channel_type: str
    chat_type: ChatType
    channel_thread_id: str | None
    channel_user_id: str | None
    name: str
    last_active_at: datetime


class SegmentOut(Schema):
    type: str
    data: str | None = None
    sha256: str | None = None
    size: int | None = None


class ContentOut(Schema):
    type: Literal["text", "rich_text", "image"]
    format: Literal["plain", "markdown"]
    text: str
    segments: list[SegmentOut]


class DeliveryOut(Schema):
    message_id: str = Field(description="The outbound chat message's id (message_info.message_id on the wire).")
    status: Literal["pending", "sending", "sent", "delivered", "unconfirmed", "failed"] = Field(
        description="pending (in the outbox) → sending → sent (handed to the adapter) → delivered (the platform "
        "confirmed it) | unconfirmed (no confirmation after every attempt); failed: not delivered, `error` says why "
        "(`delivery_interrupted`: the server stopped mid-send and it was not sent again)"
    )
    sent_at: datetime | None = Field(description="When it was last handed to the adapter.")
    delivered_at: datetime | None = Field(description="When the platform confirmed it (the adapter's echo).")
    platform_message_id: str | None = Field(description="The platform's id, once the adapter echoed it.")
    error: str | None


STATUS_DESCRIPTION = (
    "What became of the message, from its outbound message's delivery once it is written: "
    "`pending` (waiting for send_at; may be cancelled) | `cancelled` | "
    "`sending` (being delivered: in the outbox, or being handed to the adapter) → "
    "`sent` (handed to the adapter, awaiting the platform's confirmation; final for a platform whose adapter "
    "never confirms) → `delivered` (the platform confirmed it) | `unconfirmed` (no confirmation after every "
    "attempt) | `failed` (not delivered: `failure_reason` says why). `delivery.status` is the outbound message's "
    "own state."
)


class MessageOut(Schema):
    id: str
    status: Fate = Field(description=STATUS_DESCRIPTION)
    origin: str
    conversation: ConversationOut
    content: ContentOut
    send_at: datetime
    created_at: datetime
    sent_at: datetime | None
    cancelled_at: datetime | None
    cancel_reason: str | None
    failure_reason: str | None
    attempts: int
    delivery: DeliveryOut | None = Field(description="The outbound message, once the bot wrote it to the outbox.")


class Page(Schema):
    count: int
    limit: int
    offset: int
    next_offset: int | None


class MessagePage(Page):
    items: list[MessageOut]


class ConversationPage(Page):
    items: list[ConversationOut]


ERRORS = {code: ErrorOut for code in (400, 401, 403, 404, 409, 413, 429, 503)}


# --- errors ---------------------------------------------------------------------------------------


def _error_response(request: HttpRequest, error: ApiError) -> HttpResponse:
    response = api.create_response(request, error.as_dict(), status=error.status)
    if error.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="maibot"'
    return response


@api.exception_handler(ApiError)
def on_api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return _error_response(request, exc)


def _field(loc: list[Any]) -> str:
    # ninja prefixes where the value came from and the parameter name: drop both.
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie", "form"):
        parts = parts[1:]
        if parts and parts[0] in ("payload", "filters", "page", "body"):
            parts = parts[1:]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = [
        {"field": _field(e.get("loc", [])), "message": str(e.get("msg", "invalid")), "type": str(e.get("type", ""))}
        for e in exc.errors
    ]
    first = errors[0] if errors else {"field": "body", "message": "invalid"}
    error = ApiError(
        Code.VALIDATION_ERROR, f"{first['field']}: {first['message']}", field=first["field"], errors=errors
    )
    return _error_response(request, error)


@api.exception_handler(AuthenticationError)
def on_not_authenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return _error_response(request, ApiError(Code.NOT_AUTHENTICATED, "send Authorization: Bearer <token>"))


@api.exception_handler(Throttled)
def on_throttled(request: HttpRequest, exc: Throttled) -> HttpResponse:
    # ninja adds Retry-After to this response.
    limit = f"; retry in {int(exc.wait)} s" if exc.wait else ""
    return _error_response(request, ApiError(Code.RATE_LIMITED, f"too many requests for this token{limit}"))


@api.exception_handler(RequestDataTooBig)
def on_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return _error_response(request, ApiError(Code.PAYLOAD_TOO_LARGE, "the request body is too large"))


@api.exception_handler(Http404)
def on_404(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _error_response(request, ApiError(Code.NOT_FOUND, "not found"))


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja raises HttpError(400) when the body does not parse (the JSON error is its cause).
    if isinstance(exc.__cause__, ValueError):
        return _error_response(request, ApiError(Code.INVALID_JSON, "the request body is not valid JSON"))
    body = {"code": str(Code.BAD_REQUEST), "message": exc.message}
    return api.create_response(request, body, status=exc.status_code)


# --- endpoints ------------------------------------------------------------------------------------


def _answer(request: HttpRequest, status: int, body: dict[str, Any]) -> Status | HttpResponse:
    # Errors are already in their final shape (maybe replayed from storage): send them as they are.
    if status >= 400:
        # Stored answers come back from JSONB with their keys reordered: restore the documented order.
        ordered = {k: body[k] for k in ErrorOut.model_fields if k in body}
        return api.create_response(request, ordered, status=status)
    return Status(status, body)


def _message(task: Any) -> dict[str, Any]:
    # JSON-ready: the body may be stored as an idempotent answer and replayed byte for byte.
    return MessageOut.model_validate(proactive_message_as_dict(task)).model_dump(mode="json")


# Message ids are short (`sm_k3v9xq2mtr`); anything else cannot name one.
MessageId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_]{1,32}$", description="The message id, e.g. sm_k3v9xq2mtr.")]

IDEMPOTENCY_KEY = Header(
    None,
    alias="Idempotency-Key",
    max_length=255,
    description="Repeat a request safely: the same key and body get the first answer; another body gets 409.",
)


@api.post("/messages", response={201: MessageOut, **ERRORS}, summary="Send a message now or at send_at")
def message_create(request: HttpRequest, payload: MessageIn, idempotency_key: str | None = IDEMPOTENCY_KEY):
    token = request.auth

    def operation() -> tuple[int, dict[str, Any]]:
        task = proactive_message_from(token, str(payload.origin), payload)
        return 201, _message(task)

    fingerprint = request_fingerprint(method="POST", path=request.path, body=request.body)
    return _answer(
        request, *idempotent_call(token=token, key=idempotency_key, fingerprint=fingerprint, operation=operation)
    )


@api.get("/messages/{message_id}", response={200: MessageOut, **ERRORS}, summary="A message and its delivery")
def message_detail(request: HttpRequest, message_id: MessageId):
    return Status(200, _message(proactive_message_get(token=request.auth, message_id=message_id)))


class MessageFilters(InputSchema):
    status: Fate | None = Field(None, description="Messages with this status (see MessageOut.status).")
    conversation_id: str | None = Field(None, max_length=128)
    origin: Origin | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    send_after: datetime | None = Field(None, description="send_at at or after this instant.")
    send_before: datetime | None = Field(None, description="send_at before this instant.")


class PageParams(InputSchema):
    limit: int = Field(20, ge=1, le=100)
    offset: int = Field(0, ge=0, le=1_000_000)


def _page(qs, page: PageParams, render_all) -> dict[str, Any]:
    count = qs.count()
    items = render_all(list(qs[page.offset : page.offset + page.limit]))
    nxt = page.offset + page.limit
    return {
        "count": count,
        "limit": page.limit,
        "offset": page.offset,
        "next_offset": nxt if nxt < count else None,
        "items": items,
    }


@api.get("/messages", response={200: MessagePage, **ERRORS}, summary="Proactive messages, newest first")
def message_list(request: HttpRequest, filters: Query[MessageFilters], page: Query[PageParams]):
    qs = proactive_messages_list(token=request.auth, **filters.model_dump())
    return Status(200, _page(qs, page, proactive_messages_as_dicts))


@api.post("/messages/{message_id}/cancel", response={200: MessageOut, **ERRORS}, summary="Cancel a pending message")
def message_cancel(
    request: HttpRequest,
    message_id: MessageId,
    payload: CancelIn | None = None,
    idempotency_key: str | None = IDEMPOTENCY_KEY,
):
    token = request.auth

    def operation() -> tuple[int, dict[str, Any]]:
        task = proactive_message_cancel(token=token, message_id=message_id, reason=payload.reason if payload else "")
        return 200, _message(task)

    fingerprint = request_fingerprint(method="POST", path=request.path, body=request.body)
    return _answer(
        request, *idempotent_call(token=token, key=idempotency_key, fingerprint=fingerprint, operation=operation)
    )


class ConversationFilters(InputSchema):
    channel_type: str | None = Field(None, max_length=64)
    chat_type: ChatType | None = None
    channel_user_id: str | None = Field(None, max_length=128)
    channel_thread_id: str | None = Field(None, max_length=128)


@api.get("/conversations", response={200: ConversationPage, **ERRORS}, summary="Find a conversation id")
def conversation_list(request: HttpRequest, filters: Query[ConversationFilters], page: Query[PageParams]):
    qs = conversations_list(token=request.auth, **filters.model_dump())
    return Status(200, _page(qs, page, lambda sessions: [conversation_as_dict(s) for s in sessions]))
