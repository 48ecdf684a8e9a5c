"""The wire between the host and a plugin runner: length-prefixed JSON frames over the runner's pipes.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (one object). Tuples
survive the trip (a command returns `(success, text, intercept)`): they travel as {"__tuple__": [...]}.
Anything JSON cannot carry is sent as its str(). Imported by the runner, so nothing here imports Django.
"""

from __future__ import annotations

import json
import struct
from typing import Any

MAX_FRAME = 16 * 1024 * 1024  # bytes; a bigger frame is a protocol error (the runner is restarted)
_HEADER = struct.Struct(">I")
_TUPLE = "__tuple__"


class FrameError(Exception):
    pass


def _to_wire(value: Any) -> Any:
    if isinstance(value, tuple):
        return {_TUPLE: [_to_wire(v) for v in value]}
    if isinstance(value, list):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_wire(v) for k, v in value.items()}
    return value


def _from_wire(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and _TUPLE in obj and isinstance(obj[_TUPLE], list):
        return tuple(obj[_TUPLE])
    return obj


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(_to_wire(message), ensure_ascii=False, default=str).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes is larger than {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    message = json.loads(body.decode("utf-8"), object_hook=_from_wire)
    if not isinstance(message, dict):
        raise FrameError("a frame must hold a JSON object")
    return message


def length(header: bytes) -> int:
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes announced, more than {MAX_FRAME}")
    return size


HEADER_SIZE = _HEADER.size
