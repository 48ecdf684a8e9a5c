"""render.html2png: a plugin's HTML rendered to a PNG by headless Chromium (Debian's /usr/bin/chromium),
answered as MaiBot does: `{"image_base64", "mime_type", "width", "height", "render_ms"}` under `result`.

Chromium is driven over its DevTools protocol on a pipe (`--remote-debugging-pipe`: commands on the
browser's fd 3, answers on fd 4, each a JSON message ending in NUL), so no browser-automation package
is needed. Each render starts its own browser in a fresh profile and ends it (its process group is
killed): nothing of one plugin's page is left for the next.

Bounded: the HTML's size, the viewport, the scale, the screenshot's size, one render's time, how many
run at once, and the PNG bytes a plugin may get a minute (its media budget). The browser runs in the
plugin sandbox (plugins.sandbox: its own uid, none of the data dir, a pid namespace that ends with it).
Without `allow_network` it has no network at all (a network namespace of its own: no fetch, WebSocket,
sendBeacon or anything else reaches a server, this machine's included); with it, the plugin's network
(isolated: the internet, never this machine's loopback). Besides, the page may load nothing but data:
and blob: resources unless the plugin asks (`allow_network`: http and https too), and never file://
(every request passes the Fetch domain, which refuses the rest).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from plugins import sandbox
from plugins.limits import check_media_left, limits_for, spend_media

if TYPE_CHECKING:
    from plugins.records import PluginRecord

CHROMIUM = os.environ.get("MAIBOT_CHROMIUM", "/usr/bin/chromium")
MAX_HTML_CHARS = 2 * 1024 * 1024
MAX_VIEWPORT = 4096  # pixels, each side
MAX_SHOT_SIDE = 8192  # CSS pixels of a full-page or element shot, each side
MAX_SCALE = 4.0
MAX_PNG_BYTES = 16 * 1024 * 1024
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # one DevTools answer (a screenshot's base64)
DEFAULT_RENDER_TIMEOUT_MS = 10_000
MAX_RENDER_TIMEOUT_MS = 60_000
MAX_STATIC_WAIT_MS = 10_000
NETWORK_IDLE_SETTLE = 0.5  # seconds after load that wait_until "networkidle" waits
CONCURRENT_RENDERS = 2
START_MARGIN = 5.0  # seconds a render may take beyond its render_timeout_ms: the browser starting
WAIT_UNTIL = ("load", "domcontentloaded", "networkidle", "commit")
CHROMIUM_ARGS = [
    "--headless",
    "--remote-debugging-pipe",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--hide-scrollbars",
]

_gate: asyncio.Semaphore | None = None
_gate_loop: asyncio.AbstractEventLoop | None = None


class RenderArgError(ValueError):
    """The plugin's render request is unusable; the message names the argument."""


class RenderError(RuntimeError):
    """The browser could not render the page; the message says what went wrong."""


# --- the request -------------------------------------------------------------------------------------


def _int(args: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = args.get(key, default)
    if value in (None, ""):
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise RenderArgError(f"{key} must be an integer") from None
    if not low <= number <= high:
        raise RenderArgError(f"{key} must be between {low} and {high}")
    return number


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def request_of(args: dict[str, Any]) -> dict[str, Any]:
    """The render request as MaiBot's host reads the arguments, checked and bounded."""
    html = args.get("html")
    if not isinstance(html, str) or not html.strip():
        raise RenderArgError("render.html2png needs html (a non-empty string)")
    if len(html) > MAX_HTML_CHARS:
        raise RenderArgError(f"html is longer than {MAX_HTML_CHARS} characters")
    viewport = args.get("viewport") or {}
    if not isinstance(viewport, dict):
        raise RenderArgError("viewport must be {width, height}")
    try:
        scale = float(args.get("device_scale_factor") or 2.0)
    except (TypeError, ValueError):
        raise RenderArgError("device_scale_factor must be a number") from None
    if not 0.1 <= scale <= MAX_SCALE:
        raise RenderArgError(f"device_scale_factor must be between 0.1 and {MAX_SCALE:g}")
    wait_until = str(args.get("wait_until") or "load")
    if wait_until not in WAIT_UNTIL:
        raise RenderArgError(f"wait_until is one of {', '.join(WAIT_UNTIL)}")
    timeout = args.get("render_timeout_ms") or args.get("timeout_ms") or DEFAULT_RENDER_TIMEOUT_MS
    return {
        "html": html,
        "selector": str(args.get("selector") or "body")[:500],
        "width": _int(viewport, "width", 900, 1, MAX_VIEWPORT),
        "height": _int(viewport, "height", 500, 1, MAX_VIEWPORT),
        "scale": scale,
        "full_page": _bool(args.get("full_page")),
        "omit_background": _bool(args.get("omit_background")),
        "wait_until": wait_until,
        "wait_for_selector": str(args.get("wait_for_selector") or "")[:500],
        "static_wait_ms": _int(args, "wait_for_timeout_ms", 0, 0, MAX_STATIC_WAIT_MS),
        "timeout_ms": _int({"render_timeout_ms": timeout}, "render_timeout_ms", 0, 1, MAX_RENDER_TIMEOUT_MS),
        "allow_network": _bool(args.get("allow_network")),
    }


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise RenderError("the browser's screenshot is not a PNG")
    return struct.unpack(">II", data[16:24])


# --- the browser over its DevTools pipe ----------------------------------------------------------------


def _high_fd(fd: int) -> int:
    # Above 4, so putting one on fd 3 never overwrites the other before it is moved to fd 4.
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 5)
    os.close(fd)
    return high


# The browser reads DevTools commands on fd 3 and writes on fd 4: a tiny exec wrapper puts the pipes
# there (dash, Debian's sh, cannot redirect fds above 9; subprocess cannot renumber them).
_EXEC_ON_FDS = (
    "import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); os.dup2(r, 3); os.dup2(w, 4); "
    "os.close(r); os.close(w); os.execv(sys.argv[3], sys.argv[3:])"
)


class Browser:
    """One headless Chromium and its DevTools connection (commands, answers, events) on pipes."""

    def __init__(self, network: str = "none") -> None:
        self.network = network  # the sandbox's network (plugins.sandbox): none, isolated or host
        self.proc: asyncio.subprocess.Process | None = None
        self.jail: sandbox.Jail | None = None
        self.profile = ""
        self._writer: asyncio.WriteTransport | None = None
        self._reader_task: asyncio.Task | None = None
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._handlers: dict[str, Any] = {}
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Start the browser: inside the plugin sandbox (its own uid, nothing of the data dir, a fresh
        profile in its private /tmp, `network`) unless the deployment turned the sandbox off."""
        loop = asyncio.get_running_loop()
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        child_r, child_w = _high_fd(to_browser_r), _high_fd(from_browser_w)
        profile = "/tmp/profile"
        if not sandbox.enabled():
            self.profile = profile = tempfile.mkdtemp(prefix="maibot-render-")
        command = [
            sys.executable,
            "-I",
            "-S",
            "-c",
            _EXEC_ON_FDS,
            str(child_r),
            str(child_w),
            CHROMIUM,
            *CHROMIUM_ARGS,
            f"--user-data-dir={profile}",
            "about:blank",
        ]
        env = None
        if sandbox.enabled():
            self.jail = sandbox.browser_jail(command=command, network=self.network)
            command, env = self.jail.argv, self.jail.env({"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *command,
                pass_fds=(child_r, child_w, *(self.jail.pass_fds if self.jail else ())),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its renderer and helper processes end with it (killpg)
            )
        finally:
            os.close(child_r)
            os.close(child_w)
            if self.jail is not None:
                self.jail.spawned()
        self._writer, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(to_browser_w, "wb", 0))
        reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(from_browser_r, "rb", 0))
        self._reader_task = asyncio.ensure_future(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                raw = await reader.readuntil(b"\0")
                message = json.loads(raw[:-1])
                if "id" in message:
                    future = self._waiting.pop(message["id"], None)
                    if future is not None and not future.done():
                        future.set_result(message)
                elif (handler := self._handlers.get(message.get("method", ""))) is not None:
                    task = asyncio.ensure_future(handler(message.get("params") or {}, message.get("sessionId")))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError) as exc:
            error = RenderError(f"the browser closed its DevTools pipe ({type(exc).__name__})")
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(error)
            self._waiting.clear()

    def on(self, method: str, handler) -> None:
        self._handlers[method] = handler

    async def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        if self._writer is None or self._reader_task is None or self._reader_task.done():
            raise RenderError("the browser is not running")
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        future = asyncio.get_running_loop().create_future()
        self._waiting[self._next_id] = future
        self._writer.write(json.dumps(message).encode() + b"\0")
        answer = await future
        if "error" in answer:
            raise RenderError(f"{method}: {answer['error'].get('message', answer['error'])}")
        return answer.get("result") or {}

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.send("Browser.close"), 2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.proc.wait(), 5)
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self.jail is not None:
            await self.jail.close()
        if self.profile:
            await asyncio.to_thread(shutil.rmtree, self.profile, True)


_LOAD = """(function (html, waitUntil) {
  document.open(); document.write(html); document.close();
  return new Promise(function (resolve) {
    if (waitUntil === "commit" || waitUntil === "domcontentloaded" || document.readyState === "complete") {
      resolve(true);
      return;
    }
    window.addEventListener("load", function () { resolve(true); }, {once: true});
  });
})"""

_WAIT_FOR = """(function (selector, ms) {
  var until = Date.now() + ms;
  return new Promise(function (resolve, reject) {
    (function poll() {
      if (document.querySelector(selector)) { resolve(true); return; }
      if (Date.now() > until) { reject(new Error("no element matches " + selector + " within " + ms + " ms")); return; }
      setTimeout(poll, 50);
    })();
  });
})"""

_BOX = """(function (selector) {
  if (selector === null) {
    var d = document.documentElement;
    return [0, 0, Math.max(d.scrollWidth, document.body ? document.body.scrollWidth : 0),
            Math.max(d.scrollHeight, document.body ? document.body.scrollHeight : 0)];
  }
  var e = document.querySelector(selector);
  if (!e) return null;
  var r = e.getBoundingClientRect();
  return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height];
})"""


async def _evaluate(browser: Browser, session: str, function: str, *args: Any) -> Any:
    expression = f"{function}({', '.join(json.dumps(a) for a in args)})"
    answer = await browser.send(
        "Runtime.evaluate",
        {"expression": expression, "awaitPromise": True, "returnByValue": True},
        session,
    )
    if "exceptionDetails" in answer:
        details = answer["exceptionDetails"]
        text = (details.get("exception") or {}).get("description") or details.get("text") or "script error"
        raise RenderError(str(text).splitlines()[0])
    return (answer.get("result") or {}).get("value")


async def _render(req: dict[str, Any], network: str) -> bytes:
    browser = Browser(network if req["allow_network"] else "none")
    try:
        await browser.start()
        target = await browser.send("Target.createTarget", {"url": "about:blank"})
        if browser.jail is not None:
            await browser.jail.connect_network()  # the browser runs: bwrap has set its namespaces up
        attached = await browser.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        session = attached["sessionId"]
        allow_network = req["allow_network"]

        async def paused(params: dict, session_id: str | None) -> None:
            url = str((params.get("request") or {}).get("url") or "")
            allowed = url.startswith(("data:", "blob:")) or (allow_network and url.startswith(("http:", "https:")))
            method = "Fetch.continueRequest" if allowed else "Fetch.failRequest"
            reply: dict[str, Any] = {"requestId": params.get("requestId")}
            if not allowed:
                reply["errorReason"] = "BlockedByClient"
            with contextlib.suppress(RenderError):
                await browser.send(method, reply, session_id)

        browser.on("Fetch.requestPaused", paused)
        await browser.send("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, session)
        await browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": req["width"], "height": req["height"], "deviceScaleFactor": req["scale"], "mobile": False},
            session,
        )
        if req["omit_background"]:
            transparent = {"color": {"r": 0, "g": 0, "b": 0, "a": 0}}
            await browser.send("Emulation.setDefaultBackgroundColorOverride", transparent, session)
        await _evaluate(browser, session, _LOAD, req["html"], req["wait_until"])
        if req["wait_until"] == "networkidle":
            await asyncio.sleep(NETWORK_IDLE_SETTLE)
        if req["wait_for_selector"]:
            await _evaluate(browser, session, _WAIT_FOR, req["wait_for_selector"], req["timeout_ms"])
        if req["static_wait_ms"]:
            await asyncio.sleep(req["static_wait_ms"] / 1000)

        shot: dict[str, Any] = {"format": "png"}
        if req["selector"] != "body" or req["full_page"]:
            box = await _evaluate(browser, session, _BOX, None if req["selector"] == "body" else req["selector"])
            if box is None:
                raise RenderArgError(f"selector {req['selector']!r} matches nothing in the page")
            x, y, width, height = (float(v) for v in box)
            if width < 1 or height < 1:
                raise RenderArgError(f"selector {req['selector']!r} matches an element with no size")
            if width > MAX_SHOT_SIDE or height > MAX_SHOT_SIDE:
                raise RenderArgError(f"the shot would be larger than {MAX_SHOT_SIDE} CSS pixels on a side")
            shot["clip"] = {"x": x, "y": y, "width": width, "height": height, "scale": 1}
            shot["captureBeyondViewport"] = True
        answer = await browser.send("Page.captureScreenshot", shot, session)
        return base64.b64decode(answer.get("data") or "")
    finally:
        await browser.close()


def _gate_for_loop() -> asyncio.Semaphore:
    global _gate, _gate_loop
    loop = asyncio.get_running_loop()
    if _gate is None or _gate_loop is not loop:
        _gate, _gate_loop = asyncio.Semaphore(CONCURRENT_RENDERS), loop
    return _gate


async def html2png(record: PluginRecord | None, args: dict[str, Any]) -> dict[str, Any]:
    try:
        req = request_of(args)
    except RenderArgError as exc:
        return {"success": False, "error": str(exc)}
    if not shutil.which(CHROMIUM):
        return {"success": False, "error": f"render.html2png needs Chromium at {CHROMIUM} (apt-get install chromium)"}
    network = limits_for(record.plugin_id).network if record is not None else "none"
    if req["allow_network"] and sandbox.effective_network(network) == "none" and sandbox.enabled():
        return {"success": False, "error": "allow_network: this plugin has no network (plugins.network)"}
    if record is not None:
        check_media_left(record)  # refused while the plugin's media budget is spent
    started = time.perf_counter()
    async with _gate_for_loop():
        try:
            # Start, load and shoot within the render's time, plus a margin for the browser's start.
            png = await asyncio.wait_for(_render(req, network), req["timeout_ms"] / 1000 + START_MARGIN)
        except (RenderArgError, RenderError) as exc:
            return {"success": False, "error": str(exc)[:500]}
        except TimeoutError:
            return {"success": False, "error": f"the render took longer than {req['timeout_ms']} ms"}
        except OSError as exc:
            return {"success": False, "error": f"Chromium could not be started: {exc}"[:500]}
    if record is not None:
        spend_media(record, len(png))
    if len(png) > MAX_PNG_BYTES:
        return {"success": False, "error": f"the PNG is larger than {MAX_PNG_BYTES} bytes"}
    width, height = png_size(png)
    return {
        "success": True,
        "result": {
            "image_base64": base64.b64encode(png).decode("ascii"),
            "mime_type": "image/png",
            "width": width,
            "height": height,
            "render_ms": int((time.perf_counter() - started) * 1000),
        },
    }
