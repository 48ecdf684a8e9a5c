"""Failure codes the timer, memory and life-loop services and tools return (stable strings, part of the tool API)."""

from enum import StrEnum


class TimerErrorCode(StrEnum):
    INVALID_ARGUMENT = "invalid_argument"
    INVALID_SPEC = "invalid_spec"
    EMPTY_LABEL = "empty_label"
    LABEL_TOO_LONG = "label_too_long"
    PAYLOAD_TOO_LONG = "payload_too_long"
    TOO_MANY_TIMERS = "too_many_timers"
    NOT_FOUND = "not_found"
    NOT_ACTIVE = "not_active"
    STORAGE_ERROR = "storage_error"


class MemoryErrorCode(StrEnum):
    INVALID_KEY = "invalid_key"
    EMPTY_CONTENT = "empty_content"
    CONTENT_TOO_LONG = "content_too_long"
    MEMORY_FULL = "memory_full"
    NOT_FOUND = "not_found"
    INVALID_SCOPE = "invalid_scope"
    TEXT_TOO_LONG = "text_too_long"


class LifeToolErrorCode(StrEnum):
    """Failures of the life loop's own tools (send_message, update_inner_state, do_nothing); the
    engine's own (unknown_tool, invalid_arguments, tool_timeout…) are chat.components.ToolErrorCode."""

    INVALID_ARGUMENT = "invalid_argument"
    EMPTY_TEXT = "empty_text"
    TEXT_TOO_LONG = "text_too_long"
    UNKNOWN_SESSION = "unknown_session"
    NO_SESSION = "no_session"


class LifeError(Exception):
    """A request the timer or memory services refuse, with a code and a sentence for people and models."""

    def __init__(self, code: TimerErrorCode | MemoryErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def as_dict(self) -> dict[str, str]:
        return {"code": str(self.code), "message": self.message}
