"""Failure codes of the proactive message API (stable strings clients may branch on) and its error."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ApiErrorCode(StrEnum):
    # 401
    NOT_AUTHENTICATED = "not_authenticated"
    INVALID_TOKEN = "invalid_token"
    TOKEN_REVOKED = "token_revoked"
    # 400: the request itself is wrong
    BAD_REQUEST = "bad_request"
    VALIDATION_ERROR = "validation_error"
    INVALID_JSON = "invalid_json"
    MISSING_ANCHOR = "missing_anchor"
    CONFLICTING_ANCHOR = "conflicting_anchor"
    MISSING_CHANNEL_TYPE = "missing_channel_type"
    INVALID_CONTENT = "invalid_content"
    EMPTY_TEXT = "empty_text"
    TEXT_TOO_LONG = "text_too_long"
    INVALID_IMAGE = "invalid_image"
    IMAGE_TOO_LARGE = "image_too_large"
    INVALID_SEND_AT = "invalid_send_at"
    # 403: the token may not do this
    INSUFFICIENT_SCOPE = "insufficient_scope"
    FORBIDDEN_CONVERSATION = "forbidden_conversation"
    # 404
    NOT_FOUND = "not_found"
    CONVERSATION_NOT_FOUND = "conversation_not_found"
    THREAD_NOT_FOUND = "thread_not_found"
    MESSAGE_NOT_FOUND = "message_not_found"
    # 409
    NOT_PENDING = "not_pending"
    TOO_MANY_PENDING = "too_many_pending"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    REQUEST_IN_PROGRESS = "request_in_progress"
    # 413, 429, 503
    PAYLOAD_TOO_LARGE = "payload_too_large"
    RATE_LIMITED = "rate_limited"
    STORAGE_ERROR = "storage_error"


STATUS: dict[ApiErrorCode, int] = {
    ApiErrorCode.NOT_AUTHENTICATED: 401,
    ApiErrorCode.INVALID_TOKEN: 401,
    ApiErrorCode.TOKEN_REVOKED: 401,
    ApiErrorCode.INSUFFICIENT_SCOPE: 403,
    ApiErrorCode.FORBIDDEN_CONVERSATION: 403,
    ApiErrorCode.NOT_FOUND: 404,
    ApiErrorCode.CONVERSATION_NOT_FOUND: 404,
    ApiErrorCode.THREAD_NOT_FOUND: 404,
    ApiErrorCode.MESSAGE_NOT_FOUND: 404,
    ApiErrorCode.NOT_PENDING: 409,
    ApiErrorCode.TOO_MANY_PENDING: 409,
    ApiErrorCode.IDEMPOTENCY_KEY_REUSED: 409,
    ApiErrorCode.REQUEST_IN_PROGRESS: 409,
    ApiErrorCode.PAYLOAD_TOO_LARGE: 413,
    ApiErrorCode.RATE_LIMITED: 429,
    ApiErrorCode.STORAGE_ERROR: 503,
}


class ApiError(Exception):
    """A request the API refuses: a code, a sentence for people, and the offending field if any."""

    def __init__(
        self,
        code: ApiErrorCode,
        message: str,
        *,
        field: str | None = None,
        errors: list[dict[str, Any]] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.errors = errors
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return STATUS.get(self.code, 400)

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": str(self.code), "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        if self.errors:
            body["errors"] = self.errors
        return body
