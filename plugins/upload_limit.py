"""Bounds on a plugin upload's request (the console's Install and Update forms): a body declared larger than
MAIBOT_PLUGIN_INSTALL_MAX_UPLOAD (and a little for the form around it), or not declared at all, is
answered 413/411 before it is read. Two layers: daphne (Twisted) reads a whole body into a temporary file
before the application sees the request, so under daphne the check runs when the request's headers are
in (`refuse_big_uploads_in_daphne`, patching daphne's request class once per process); the ASGI layer
(`limit_plugin_uploads`) checks the same for any other server and cuts off a client that sends more than
it declared."""

from __future__ import annotations

import sys

from django.conf import settings

PATHS = ("/admin/plugins/install/", "/admin/plugins/update/")
FORM_OVERHEAD = 64 * 1024


def max_body() -> int:
    return settings.MAIBOT_PLUGIN_INSTALL_MAX_UPLOAD + FORM_OVERHEAD


def _refusal(length: int | None) -> tuple[int, str]:
    if length is None:
        return 411, "411: a plugin upload must declare its Content-Length\n"
    mib = settings.MAIBOT_PLUGIN_INSTALL_MAX_UPLOAD / (1024 * 1024)
    return 413, f"413: 上传过大 / upload too large (at most {mib:g} MiB)\n"


class _Discard:
    """The body of a refused request: whatever still arrives before the connection closes is dropped."""

    def write(self, data: bytes) -> None:
        pass

    def seek(self, *args) -> int:
        return 0

    def read(self, *args) -> bytes:
        return b""

    def close(self) -> None:
        pass


def refuse_big_uploads_in_daphne() -> None:
    """Under daphne: answer a plugin upload over the limit when its headers are in, and close."""
    module = sys.modules.get("daphne.http_protocol")
    if module is None or getattr(module.WebRequest, "_plugin_upload_limit", False):
        return
    original = module.WebRequest.gotLength

    def gotLength(self, length):  # Twisted's name
        channel = self.channel
        path = (getattr(channel, "_path", b"") or b"").split(b"?")[0]
        if getattr(channel, "_command", b"") != b"POST" or path not in {p.encode() for p in PATHS}:
            return original(self, length)
        if length is not None and length <= max_body():
            return original(self, length)
        status, text = _refusal(length)
        body = text.encode("utf-8")
        head = f"HTTP/1.1 {status} Refused\r\nContent-Type: text/plain; charset=utf-8\r\n"
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        self.content = _Discard()
        channel.transport.write(head.encode() + body)
        channel.transport.loseConnection()

    module.WebRequest.gotLength = gotLength
    module.WebRequest._plugin_upload_limit = True


async def _refuse(send, status: int, text: str) -> None:
    body = text.encode("utf-8")
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def limit_plugin_uploads(app):
    async def wrapper(scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in PATHS or scope.get("method") != "POST":
            return await app(scope, receive, send)
        limit = max_body()
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is None or not declared.isdigit() or int(declared) > limit:
            return await _refuse(send, *_refusal(int(declared) if declared and declared.isdigit() else None))
        seen = 0

        async def bounded():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            return {"type": "http.disconnect"} if seen > limit else message

        return await app(scope, bounded, send)

    return wrapper
