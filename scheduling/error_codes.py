"""Failure codes the scheduled-message services and tools return (stable strings, part of the tool API)."""

from enum import StrEnum


class SchedulingErrorCode(StrEnum):
    NOT_PRIVATE_CHAT = "not_private_chat"
    INVALID_TIME = "invalid_time"
    EMPTY_TEXT = "empty_text"
    INVALID_TEXT = "invalid_text"
    TEXT_TOO_LONG = "text_too_long"
    TOO_MANY_PENDING = "too_many_pending"
    STORAGE_ERROR = "storage_error"
    NOT_FOUND = "not_found"
    NOT_PENDING = "not_pending"
    # Only a sent message whose delivery came to nothing (unconfirmed or failed) can be resent.
    NOT_RESENDABLE = "not_resendable"
    NO_SESSION = "no_session"


class SchedulingError(Exception):
    """A request the scheduling services refuse, with a code and a sentence for people and models."""

    def __init__(self, code: SchedulingErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def as_dict(self) -> dict[str, str]:
        return {"code": str(self.code), "message": self.message}
