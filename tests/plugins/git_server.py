"""A git server on 127.0.0.1 for the install tests: git's own smart-HTTP CGI (`git http-backend`) behind
a small threaded HTTP server, serving the bare repositories of one folder; /redirect/<target> answers a
302 to <target> (a file:// URL, say), /slow/ never answers."""

from __future__ import annotations

import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def git(*args: str, cwd: Path) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "init.defaultBranch=main"]
    done = subprocess.run(["git", *ident, *args], cwd=cwd, env=env, capture_output=True, check=True)
    return done.stdout.decode()


def bare_repo(root: Path, name: str, files: dict[str, bytes], symlinks: dict[str, str] | None = None) -> Path:
    """root/<name>.git: a bare repository of one commit holding `files` (and `symlinks`: path → target)."""
    work = root / f"{name}-work"
    work.mkdir(parents=True)
    for rel, data in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    for rel, target in (symlinks or {}).items():
        (work / rel).symlink_to(target)
    git("init", "-q", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "plugin", cwd=work)
    bare = root / f"{name}.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=root)
    shutil.rmtree(work)
    return bare


class GitServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        self.stopped = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self.handle_git()

            def do_POST(self) -> None:
                self.handle_git()

            def handle_git(self) -> None:
                server.requests.append(self.path)
                parts = urlsplit(self.path)
                if parts.path.startswith("/redirect/"):
                    self.send_response(302)
                    self.send_header("Location", unquote(parts.path.removeprefix("/redirect/")))
                    self.end_headers()
                    return
                if parts.path.startswith("/slow/"):
                    server.stopped.wait()  # never answers while the server runs
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                env = {
                    "PATH": "/usr/bin:/bin",
                    "GIT_PROJECT_ROOT": str(server.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": unquote(parts.path),
                    "QUERY_STRING": parts.query,
                    "REQUEST_METHOD": self.command,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "REMOTE_ADDR": "127.0.0.1",
                }
                out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                headers = [line.split(":", 1) for line in head.decode().split("\r\n") if ":" in line]
                status = next((int(v.split()[0]) for k, v in headers if k.lower() == "status"), 200)
                self.send_response(status)
                for key, value in headers:
                    if key.lower() != "status":
                        self.send_header(key, value.strip())
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> GitServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.httpd.shutdown()
        self.httpd.server_close()
