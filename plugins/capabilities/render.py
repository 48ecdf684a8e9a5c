"""render.html2png: a plugin's HTML rendered to a PNG by headless Chromium (Debian's /usr/bin/chromium,
driven with Playwright), answered as MaiBot does: `{"image_base64", "mime_type", "width", "height",
"render_ms"}` under `result`.

Bounded: the HTML's size, the viewport, the scale, the output's size, one render's time, and how many
run at once. The page has no network unless the plugin asks (`allow_network`), and never file://
(every request but data: and blob: is refused). Each render starts its own browser and closes it:
nothing of one plugin's page is left for the next.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import struct
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugins.records import PluginRecord

CHROMIUM = os.environ.get("MAIBOT_CHROMIUM", "/usr/bin/chromium")
MAX_HTML_CHARS = 2 * 1024 * 1024
MAX_VIEWPORT = 4096  # pixels, each side
MAX_SCALE = 4.0
MAX_PNG_BYTES = 16 * 1024 * 1024
DEFAULT_RENDER_TIMEOUT_MS = 10_000
MAX_RENDER_TIMEOUT_MS = 60_000
MAX_STATIC_WAIT_MS = 10_000
CONCURRENT_RENDERS = 2
WAIT_UNTIL = ("load", "domcontentloaded", "networkidle", "commit")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--mute-audio",
]

_gate: asyncio.Semaphore | None = None
_gate_loop: asyncio.AbstractEventLoop | None = None


class RenderArgError(ValueError):
    pass


def _gate_for_loop() -> asyncio.Semaphore:
    global _gate, _gate_loop
    loop = asyncio.get_running_loop()
    if _gate is None or _gate_loop is not loop:
        _gate, _gate_loop = asyncio.Semaphore(CONCURRENT_RENDERS), loop
    return _gate


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
    """The render request, checked and bounded (RenderArgError names the argument)."""
    html = args.get("html")
    if not isinstance(html, str) or not html.strip():
        raise RenderArgError("render.html2png needs html (a non-empty string)")
    if len(html) > MAX_HTML_CHARS:
        raise RenderArgError(f"html is longer than {MAX_HTML_CHARS} characters")
    viewport = args.get("viewport") or {}
    if not isinstance(viewport, dict):
        raise RenderArgError("viewport must be {width, height}")
    width = _int(viewport, "width", 900, 1, MAX_VIEWPORT)
    height = _int(viewport, "height", 500, 1, MAX_VIEWPORT)
    try:
        scale = float(args.get("device_scale_factor") or 2.0)
    except (TypeError, ValueError):
        raise RenderArgError("device_scale_factor must be a number") from None
    if not 0.1 <= scale <= MAX_SCALE:
        raise RenderArgError(f"device_scale_factor must be between 0.1 and {MAX_SCALE:g}")
    wait_until = str(args.get("wait_until") or "load")
    if wait_until not in WAIT_UNTIL:
        raise RenderArgError(f"wait_until is one of {', '.join(WAIT_UNTIL)}")
    timeout_ms = args.get("render_timeout_ms") or args.get("timeout_ms") or DEFAULT_RENDER_TIMEOUT_MS
    return {
        "html": html,
        "selector": str(args.get("selector") or "body")[:500],
        "width": width,
        "height": height,
        "scale": scale,
        "full_page": _bool(args.get("full_page")),
        "omit_background": _bool(args.get("omit_background")),
        "wait_until": wait_until,
        "wait_for_selector": str(args.get("wait_for_selector") or "")[:500],
        "static_wait_ms": _int(args, "wait_for_timeout_ms", 0, 0, MAX_STATIC_WAIT_MS),
        "timeout_ms": _int({"t": timeout_ms}, "t", DEFAULT_RENDER_TIMEOUT_MS, 1, MAX_RENDER_TIMEOUT_MS),
        "allow_network": _bool(args.get("allow_network")),
    }


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise RuntimeError("the browser's screenshot is not a PNG")
    return struct.unpack(">II", data[16:24])


async def _render(req: dict[str, Any]) -> bytes:
    from playwright.async_api import async_playwright

    timeout = req["timeout_ms"]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=timeout, handle_sigint=False, handle_sigterm=False
        )
        try:
            context = await browser.new_context(
                viewport={"width": req["width"], "height": req["height"]},
                device_scale_factor=req["scale"],
                java_script_enabled=True,
                accept_downloads=False,
                service_workers="block",
            )
            allow_network = req["allow_network"]

            async def route(r) -> None:
                url = r.request.url
                if url.startswith(("data:", "blob:")) or (allow_network and url.startswith(("http:", "https:"))):
                    await r.continue_()
                else:
                    await r.abort("blockedbyclient")

            await context.route("**/*", route)
            page = await context.new_page()
            page.set_default_timeout(timeout)
            await page.set_content(req["html"], wait_until=req["wait_until"], timeout=timeout)
            if req["wait_for_selector"]:
                await page.wait_for_selector(req["wait_for_selector"], timeout=timeout)
            if req["static_wait_ms"]:
                await page.wait_for_timeout(req["static_wait_ms"])
            options = {"type": "png", "omit_background": req["omit_background"], "timeout": timeout}
            if req["selector"] == "body":
                return await page.screenshot(full_page=req["full_page"], **options)
            element = await page.query_selector(req["selector"])
            if element is None:
                raise RenderArgError(f"selector {req['selector']!r} matches nothing in the page")
            return await element.screenshot(**options)
        finally:
            await browser.close()


async def html2png(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    try:
        req = request_of(args)
    except RenderArgError as exc:
        return {"success": False, "error": str(exc)}
    if not shutil.which(CHROMIUM):
        return {"success": False, "error": f"render.html2png needs Chromium at {CHROMIUM} (apt-get install chromium)"}
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return {"success": False, "error": "render.html2png needs the playwright package (requirements.txt)"}
    started = time.perf_counter()
    async with _gate_for_loop():
        try:
            # Launch, load and shoot within the render's time, plus a margin for closing the browser.
            png = await asyncio.wait_for(_render(req), req["timeout_ms"] / 1000 + 5)
        except RenderArgError as exc:
            return {"success": False, "error": str(exc)}
        except TimeoutError:
            return {"success": False, "error": f"the render took longer than {req['timeout_ms']} ms"}
        except Exception as exc:
            # Playwright's errors (a bad selector, a page that never loads) are the plugin's error result.
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return {"success": False, "error": f"render failed: {type(exc).__name__}: {first}"[:500]}
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
