"""A local OpenAI-compatible HTTP server with scripted answers, for tests and benchmarks.

The real `openai` client talks to it over HTTP on 127.0.0.1; only the remote provider is replaced.

    with FakeLLM() as llm:
        llm.script(llm.tool_call("reply", {"text": "pong"}), llm.text("done"))
        ... point OPENAI_BASE_URL / bot config base_url at llm.base_url ...
        llm.requests  # the JSON bodies received, in order

Each scripted answer is used once, in order. An answer may be a dict (a full response body), the
result of `text()` / `tool_call()` / `tool_calls()`, `error(status)` or `delay(seconds, answer)`; a
callable answer gets the request body and returns one of those. When the script is empty, the
`default` responder answers (a plain text "ok" unless set).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
_ids = itertools.count(1)


class FakeLLM:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._script: list[Answer] = []
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.answered = 0  # answers resolved (delays served), whether or not the client still listened
        self.default: Answer = lambda body: self.text("ok")
        # /embeddings: a vector per input ([characters, code point sum mod 97, 1.0]), or this status's error.
        self.embedding_requests: list[dict[str, Any]] = []
        self.embedding_status = 200
        # /audio/transcriptions: `transcript` (the raw multipart bodies kept), or this status's error.
        self.transcription_requests: list[bytes] = []
        # Each chat completion's Authorization header (the API key the caller used), in arrival order.
        self.authorizations: list[str] = []
        self.transcription_status = 200
        self.transcript = "你好，麦麦"
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as two writes: with Nagle on, a keep-alive client's delayed ACK
            # stalls every answer after the first by ~40 ms.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.path.rstrip("/").endswith("/audio/transcriptions"):  # multipart: the file's bytes
                    with fake._lock:
                        fake.transcription_requests.append(raw)
                    self._send(
                        fake.transcription_status,
                        {"text": fake.transcript}
                        if fake.transcription_status == 200
                        else {"error": {"message": "asr failed"}},
                    )
                    return
                body = json.loads(raw or b"{}")
                if self.path.rstrip("/").endswith("/embeddings"):
                    with fake._lock:
                        fake.embedding_requests.append(body)
                    self._send(*fake.embeddings(body))
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                with fake._lock:
                    fake.requests.append(body)
                    fake.authorizations.append(self.headers.get("Authorization") or "")
                    answer = fake._script.pop(0) if fake._script else fake.default
                status, payload = fake._resolve(answer, body)
                self._send(status, payload)
                with fake._lock:
                    fake.answered += 1

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        # A short poll interval: stop() (server.shutdown) waits for the serving loop's next poll.
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def embeddings(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.embedding_status != 200:
            return self.embedding_status, {"error": {"message": f"embedding failed ({self.embedding_status})"}}
        texts = body.get("input") if isinstance(body.get("input"), list) else [body.get("input") or ""]
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(t)), float(sum(map(ord, t)) % 97), 1.0]}
            for i, t in enumerate(texts)
        ]
        usage = {"prompt_tokens": sum(len(t) for t in texts), "total_tokens": sum(len(t) for t in texts)}
        return 200, {"object": "list", "data": data, "model": body.get("model"), "usage": usage}

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> FakeLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- scripting --------------------------------------------------------------------------------
    def script(self, *answers: Answer) -> None:
        with self._lock:
            self._script.extend(answers)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    def _resolve(self, answer: Answer, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        while callable(answer):
            answer = answer(body)
        if "_delay" in answer:
            time.sleep(answer["_delay"])  # kept: the scripted slow model itself, not a wait for a condition
            return self._resolve(answer["_then"], body)
        if "_status" in answer:
            return answer["_status"], {"error": {"message": answer["_message"], "type": "server_error"}}
        return 200, answer

    @staticmethod
    def _completion(message: dict[str, Any], usage: tuple[int, int, int] = (100, 20, 0)) -> dict[str, Any]:
        prompt, completion, cached = usage
        return {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    @classmethod
    def text(cls, content: str, usage: tuple[int, int, int] = (100, 20, 0)) -> dict[str, Any]:
        return cls._completion({"role": "assistant", "content": content}, usage)

    @classmethod
    def tool_calls(
        cls, *calls: tuple[str, dict[str, Any] | str], usage: tuple[int, int, int] = (100, 20, 0)
    ) -> dict[str, Any]:
        """Several tool calls in one answer. A str argument is sent raw (malformed JSON tests)."""
        tool_calls = [
            {
                "id": f"call_{next(_ids)}",
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
            for name, args in calls
        ]
        return cls._completion({"role": "assistant", "content": None, "tool_calls": tool_calls}, usage)

    @classmethod
    def tool_call(cls, name: str, args: dict[str, Any] | str, **kw: Any) -> dict[str, Any]:
        return cls.tool_calls((name, args), **kw)

    @staticmethod
    def error(status: int = 500, message: str = "scripted failure") -> dict[str, Any]:
        return {"_status": status, "_message": message}

    @staticmethod
    def delay(seconds: float, then: Answer) -> dict[str, Any]:
        return {"_delay": seconds, "_then": then}
