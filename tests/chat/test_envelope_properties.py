"""Property-based pass over the envelope parser: whatever JSON an adapter sends, parsing answers with a
message or an EnvelopeError — never a crash that could take the connection down."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.wire.inbound import EnvelopeError, is_custom_message, parse_custom, parse_envelope
from tests.chat.gateway_helpers import envelope

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=30,
)
KEYS = st.sampled_from(
    [
        "message_info",
        "message_segment",
        "raw_message",
        "platform",
        "user_info",
        "group_info",
        "type",
        "data",
        "user_id",
        "group_id",
        "message_id",
        "time",
        "format_info",
        "message_type_name",
        "content",
        "is_custom_message",
    ]
)


def _parse(frame):
    try:
        if isinstance(frame, dict) and is_custom_message(frame):
            return parse_custom(frame)
        return parse_envelope(frame)
    except EnvelopeError:
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, JSON, max_size=6))
def test_any_json_object_is_parsed_or_refused(frame):
    _parse(frame)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.lists(
        st.sampled_from(["message_info", "user_info", "group_info", "message_segment", "data"]), min_size=1, max_size=3
    ),
    value=JSON,
)
def test_a_real_envelope_with_any_part_replaced_is_parsed_or_refused(path, value):
    frame = envelope()
    node = frame
    for key in path[:-1]:
        child = node.get(key) if isinstance(node, dict) else None
        if not isinstance(child, dict):
            break
        node = child
    if isinstance(node, dict):
        node[path[-1]] = value
    _parse(frame)
