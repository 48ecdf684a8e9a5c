"""Why an outbound message failed: the codes stored in Message.delivery_error."""

from __future__ import annotations

from enum import StrEnum


class DeliveryError(StrEnum):
    # The platform's adapter stayed away longer than gateway.offline_expiry_seconds.
    ADAPTER_OFFLINE = "adapter_offline"
    # The process that claimed the row died mid-send (its lease ran out); not resent, to never send twice
    # (on a platform whose adapter echoes, such a row is handed over again instead).
    INTERRUPTED = "delivery_interrupted"
    # Nothing is left once the segment types the adapter does not accept are dropped.
    UNSUPPORTED = "unsupported_segments"
    # A media segment names a stored file that is gone or unreadable.
    MEDIA_MISSING = "media_missing"
    # The row could not be turned into a frame at all.
    BAD_MESSAGE = "bad_message"
    # Handed over gateway.max_delivery_attempts times to a platform whose adapter echoes, and no echo came.
    NO_ECHO = "no_echo"
    # An adapter plugin's message gateway answered that it could not send (its reason follows the code).
    GATEWAY_FAILED = "gateway_failed"
    # A `send_service.before_send` handler stopped the message (the handler's name follows the code).
    HOOK_ABORTED = "hook_aborted"
    # The before_send handlers could not run: the chat's background backlog was full, or the server
    # holding the message died before they finished (chat.send_hooks). Never sent unchecked.
    HOOK_NOT_RUN = "before_send_not_run"


# Not a failure: the `delivery_error` of a pending row whose before_send handlers are still running. The
# outbox claims no row carrying it (chat.send_hooks releases or fails it).
HELD = "held: send_service.before_send"
