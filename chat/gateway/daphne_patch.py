"""A patch to daphne's websocket protocol so the application may close with RFC 6455 codes such as 1008."""

from __future__ import annotations

import sys


def allow_protocol_close_codes() -> None:
    """Let the application close websockets with RFC 6455 codes such as 1008 (policy violation).

    The wire protocol needs 1008 for a bad token, but autobahn's public sendClose (which daphne calls)
    accepts only 1000 and 3000–4999 from applications. Its sendCloseFrame sends any code.
    """
    if "daphne.ws_protocol" not in sys.modules:
        return
    from daphne.ws_protocol import WebSocketProtocol

    if getattr(WebSocketProtocol, "_maibot_close_codes", False):
        return
    original = WebSocketProtocol.serverClose

    def server_close(self, code=None):
        if code is not None and 1000 < code < 3000 and code not in (1005, 1006, 1015):
            self.sendCloseFrame(code=code, isReply=False)
        else:
            original(self, code=code)

    WebSocketProtocol.serverClose = server_close
    WebSocketProtocol._maibot_close_codes = True
