"""`manage.py serve`: the ASGI server (daphne) and the task cluster together, for one machine.

Prints the URLs, and on Ctrl-C (or SIGTERM) stops both cleanly; if either dies, the other is stopped.
"""

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand

# Adapter frames carry base64 media: accept up to 100 MiB (daphne's default is 1 MiB), and never
# drop a websocket for its age (daphne's default closes it after a day).
DAPHNE_OPTIONS = [
    "--websocket-max-message-size",
    str(100 * 1024 * 1024),
    "--websocket-max-frame-size",
    str(100 * 1024 * 1024),
    "--websocket_timeout",
    "-1",
]
ASGI_APPLICATION = "maibot.asgi:application"


class Command(BaseCommand):
    help = "Run the ASGI server and the qcluster (dispatcher + workers) together."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.HOST)
        parser.add_argument("--port", type=int, default=settings.PORT)

    def handle(self, *args, **options) -> None:
        host, port = options["host"], options["port"]
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        env = {**os.environ}
        children = {
            "web": subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", host, "-p", str(port), *DAPHNE_OPTIONS, ASGI_APPLICATION],
                cwd=settings.BASE_DIR,
                env=env,
            ),
            "cluster": subprocess.Popen([*manage, "qcluster"], cwd=settings.BASE_DIR, env=env),
        }
        base = f"http://{host}:{port}"
        self.stdout.write(
            self.style.SUCCESS("maibot is starting")
            + f"\n  operator console: {base}/admin/"
            + f"\n  chat page:        {base}/chat/"
            + f"\n  API docs:         {base}/api/v1/docs"
            + f"\n  adapters connect: ws://{host}:{port}/ws"
            + f"\n  data dir:         {settings.DATA_DIR}"
            + "\nPress Ctrl-C to stop."
        )
        stopping = False

        def stop(signum=None, frame=None) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping and all(p.poll() is None for p in children.values()):
                time.sleep(0.2)
        finally:
            for proc in children.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            for name, proc in children.items():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.stderr.write(f"{name} did not stop in time; killing it")
                    proc.kill()
                    proc.wait()
        dead = [n for n, p in children.items() if p.returncode not in (0, -signal.SIGTERM, -signal.SIGINT)]
        if not stopping and dead:
            raise SystemExit(f"{', '.join(dead)} exited unexpectedly; stopped the rest")
        self.stdout.write("maibot stopped")
