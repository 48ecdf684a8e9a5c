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
