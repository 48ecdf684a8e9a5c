"""A service on 127.0.0.1 that the server can reach and an attacker cannot: what an SSRF through a
model's base URL would read (an internal admin page, cloud metadata, a database port). Used by the
model-test and LLM-ledger tests to prove its answer never comes back to the one who pointed a model at it."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "internal-secret-7f3a"


class InternalService:
    """Answers every POST with one fixed status, content type and body (holding the secret)."""

    def __init__(self, status: int, content_type: str, body: str) -> None:
        self.hits = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                service.hits += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class BannerService:
    """A service that speaks no HTTP (SSH, Redis, a database): to whatever it is sent, it answers one
    line holding the secret and closes (an HTTP client's parse error would quote that line)."""

    def __init__(self) -> None:
        self.hits = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            with conn:
                self.hits += 1
                conn.recv(65536)
                conn.sendall(f"SSH-2.0-{SECRET} banner\r\n\r\n".encode())

    def close(self) -> None:
        self.sock.close()
