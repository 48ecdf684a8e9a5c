"""The wire between the host and a plugin runner: length-prefixed JSON frames over the runner's pipes,
each carrying one plugins.protocol message (checked by the reader, not here).

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (one object). Tuples
survive the trip (a command returns `(success, text, intercept)`): they travel as {"__tuple__": [...]}.
Anything JSON cannot carry is sent as its str(). Imported by the runner, so nothing here imports Django.

A pipe hands a reader at most what it holds (64 KiB on Linux) and may take a write in parts: frames
are read and written whole with read_frame / write_all, never with one read() or write().
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

# Bytes. A bigger frame is never sent (the request or answer fails with FrameError); one announced by
# the other side is a protocol error (the runner is restarted). It must carry the largest answer a
# capability gives: render.html2png's PNG (at most 16 MiB) as base64.
MAX_FRAME = 32 * 1024 * 1024
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


def decode(body: bytes | bytearray) -> dict[str, Any]:
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


def read_exactly(stream: BinaryIO, size: int) -> bytearray:
    """`size` bytes of a blocking stream, fewer only when it ends first."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = stream.readinto(view[got:])
        if not n:
            break
        got += n
    view.release()
    return buffer if got == size else buffer[:got]


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    """The next frame's message from a blocking stream; None when the stream ended between frames.
    EOFError when it ended within one, FrameError when the frame is not one."""
    header = read_exactly(stream, HEADER_SIZE)
    if not header:
        return None
    if len(header) < HEADER_SIZE:
        raise EOFError("the stream ended within a frame's header")
    size = length(header)
    body = read_exactly(stream, size)
    if len(body) < size:
        raise EOFError(f"the stream ended {size - len(body)} bytes short of a {size}-byte frame")
    return decode(body)


def write_all(stream: BinaryIO, data: bytes) -> None:
    """Write all of `data` to a blocking stream (a raw pipe's write may take only part of it)."""
    view = memoryview(data)
    while view:
        written = stream.write(view)
        if written is None:  # a non-blocking stream that is full: never ours, but never spin silently
            raise BlockingIOError("the stream took nothing")
        view = view[written:]
    stream.flush()
