"""What MaiBot plugins' hook handlers get, and what their answers may change, at the points chat emits
around its planner's answers, its replies and its outbound messages (chat.events), in MaiBot's names
and shapes (its src/services/send_service.py and src/maisaka/chat_loop_service.py):

* `send_service.before_send`: `message` (the SDK's message dict of the outbound row), `typing`,
  `set_reply`, `reply_message_id`, `storage_message`, `show_log`. A changed `message` changes the text
  (`processed_plain_text`) or the segments (`raw_message`, as a plugin writes them for send.*); its
  other fields (the chat, the sender) are never read back.
* `maisaka.planner.after_response`: `response`, `tool_calls` (MaiBot 1.0's `{"id", "function": {"name",
  "arguments"}}`; MaiBot 1.2's `output_items` schema is not given), `built_message_count`, the token
  counts, `session_id` / `stream_id`.
* `maisaka.replyer.before_request` / `after_response`: `session_id`, `reply_message_id`, `reply_reason`,
  `reply_tool_args`, `attempt` / `retry_count` / `max_retries`, MaiBot's request fields with this host's
  values (`request_type` "replyer", `task_name` "planner", no model or expression choice), and
  after_response the reply's `response`.
"""

from __future__ import annotations

from typing import Any

from chat.events import Point

OUTBOUND = {Point.BEFORE_SEND}
PLANNER = {Point.PLANNER_AFTER_RESPONSE}
REPLYER = {Point.REPLYER_BEFORE_REQUEST, Point.REPLYER_AFTER_RESPONSE}
POINTS = OUTBOUND | PLANNER | REPLYER


def args(point: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """chat's kwargs at one of POINTS → the plugin handler's."""
    session = kwargs.get("session")
    stream_id = session.session_id if session is not None else ""
    if point in OUTBOUND:
        from plugins.capabilities import _message

        message = _message(kwargs["message"], session)
        message["processed_plain_text"] = message["display_message"] = kwargs["text"]
        message["raw_message"] = list(kwargs["segments"])
        reply_to = str(kwargs.get("reply_message_id") or "")
        return {
            "message": message,
            "typing": False,
            "set_reply": bool(reply_to),
            "reply_message_id": reply_to,
            "storage_message": True,
            "show_log": True,
        }
    ids = {"session_id": stream_id, "stream_id": stream_id}
    if point in PLANNER:
        keys = ("response", "tool_calls", "built_message_count", "prompt_tokens", "completion_tokens", "total_tokens")
        return {**{k: kwargs[k] for k in keys if k in kwargs}, **ids}
    attempt = int(kwargs.get("attempt") or 1)
    out = {
        **ids,
        "request_type": "replyer",
        "task_name": "planner",
        "model_name": "",
        "requested_model_name": "",
        "extra_prompt": "",
        "attempt": attempt,
        "retry_count": attempt - 1,
        "max_retries": 0,
        "reply_message_id": str(kwargs.get("reply_message_id") or ""),
        "reply_reason": str(kwargs.get("reply_reason") or ""),
        "selected_expression_ids": [],
        "reply_tool_args": dict(kwargs.get("reply_tool_args") or {}),
    }
    if point == Point.REPLYER_AFTER_RESPONSE:
        out["response"] = kwargs.get("response", "")
    return out


def changes(point: str, modified: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    """A plugin's modified_kwargs at one of POINTS → chat's names (values as given: chat.events checks
    them). before_send's raw segments are left under `raw_message` for `outbound_segments`."""
    if point not in OUTBOUND:
        return {k: v for k, v in modified.items() if k in ("response", "tool_calls", "retry", "retry_reason")}
    message = modified.get("message")
    if not isinstance(message, dict):
        return {} if message is None else {"segments": message}  # not a dict: recorded as malformed
    before = sent["message"]
    out: dict[str, Any] = {}
    if "processed_plain_text" in message and message["processed_plain_text"] != before["processed_plain_text"]:
        out["text"] = message["processed_plain_text"]
    if "raw_message" in message and message["raw_message"] != before["raw_message"]:
        out["raw_message"] = message["raw_message"]
    return out


def outbound_segments(raw: Any) -> list[dict[str, Any]]:
    """A handler's new `raw_message` → stored segments (sync: media is stored; run it in a thread).
    ValueError when it cannot be read: the handler's answer is then ignored and recorded as its failure."""
    from plugins.capabilities.common import CapabilityArgError, plugin_segments

    try:
        return plugin_segments(raw, "message.raw_message")
    except CapabilityArgError as exc:
        raise ValueError(f"malformed modification: {exc}") from None
