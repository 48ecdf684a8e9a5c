"""The ASGI layer that bounds a plugin upload's request (the console's Install form): a body declared
larger than MAIBOT_PLUGIN_INSTALL_MAX_UPLOAD (and a little for the form around it), or not declared at
all, is answered 413/411 before one byte of it is read; Django would otherwise spool any body to disk
before the view could say no. A client that sends more than it declared is cut off."""

from __future__ import annotations

from django.conf import settings

PATH = "/admin/plugins/install/"
FORM_OVERHEAD = 64 * 1024


def max_body() -> int:
    return settings.MAIBOT_PLUGIN_INSTALL_MAX_UPLOAD + FORM_OVERHEAD


async def _refuse(send, status: int, text: str) -> None:
    body = text.encode("utf-8")
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def limit_plugin_uploads(app):
    async def wrapper(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != PATH or scope.get("method") != "POST":
            return await app(scope, receive, send)
        limit = max_body()
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is None or not declared.isdigit():
            return await _refuse(send, 411, "411: a plugin upload must declare its Content-Length\n")
        if int(declared) > limit:
            mib = settings.MAIBOT_PLUGIN_INSTALL_MAX_UPLOAD / (1024 * 1024)
            return await _refuse(send, 413, f"413: 上传过大 / upload too large (at most {mib:g} MiB)\n")
        seen = 0

        async def bounded():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            return {"type": "http.disconnect"} if seen > limit else message

        return await app(scope, bounded, send)

    return wrapper
