"""Adapter plugins' message gateways (`@MessageGateway` components of `plugin_type: "adapter"` plugins): the
host side MaiBot gives them (src/plugin_runtime/host/supervisor.py, platform_io/drivers/plugin_driver.py),
on our gateway (chat.gateway.plugin_adapters).

- A gateway is registered with its plugin (plugins.bridge): its declared `route_type` (duplex, send,
  receive), `platform` (if it names one, it may report no other) and `protocol`. A gateway component of a
  plugin that is not `plugin_type: "adapter"` is skipped with a note: a gateway speaks for a whole platform.
- `host.update_message_gateway_state` (the SDK's `ctx.gateway.update_state`): `ready: true` makes a sending
  gateway its platform's adapter connection (recorded like a websocket adapter's, the earlier one replaced,
  its `account_id` the bot's account there); `ready: false` ends it and the platform's rows wait. Answers
  {"accepted", "ready", "route_key"} as MaiBot does. A plugin's reports are handled one at a time, in the
  order its calls arrive, each answered before the next is handled: a plugin keeps what it last had
  accepted as its state (the NapCat adapter reports `ready: false` on a disconnect only if it believes
  itself reported ready, and reports ready again only if it believes itself not), so an answer overtaking
  an earlier one (a first `ready: true` still being recorded, a repeat of it answered at once, then
  `ready: false`) would leave it believing itself ready while we are not: silent until its next
  disconnect.
- `host.route_message` (`ctx.gateway.route_message`): the MessageDict checked (gateway_messages), its platform
  the gateway's, stored as the gateway's platform and waking the planner (chat.gateway.plugin_adapters);
  {"accepted": false} for a duplicate or a message the gateway may no longer route, an error for a message
  that is not one, names another platform, or comes from a gateway that is not ready or cannot receive.
- Outbound: the platform's rows are handed to the gateway's handler as MaiBot's platform IO calls it
  (`message`, `route`, `metadata`), and its answer is the row's fate, read as MaiBot's PluginPlatformDriver
  reads it: a dict with `success: false` failed (`error`), another dict sent (`external_message_id` or
  `message_id`: delivered), a non-empty string the platform's id, anything else sent; an exception or a
  timeout (its metadata's `timeout_ms`, else GATEWAY_TIMEOUT) failed with the reason.

A call from a runner that is not (yet) the plugin's current one waits until its components are registered
(a plugin's on_load may report its gateway before the host has its components), at most the load timeout;
one from a runner already replaced (a reload) is refused. Every refusal is on the plugin's record.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from chat.gateway.plugin_adapters import (
    GatewayUnavailable,
    PluginGatewayConnection,
    plugin_gateway_connect,
    plugin_gateway_disconnect,
    plugin_gateway_route,
)
from chat.outbox_rows import WEB_PLATFORM, Answered
from core import aio
from plugins.gateway_messages import (
    GATEWAY_ACCEPT_FORMAT,
    MAX_MESSAGE_BYTES,
    MessageDict,
    RouteMessage,
    StateUpdate,
    inbound_envelope,
    message_size,
    outbound_message,
)
from plugins.host_base import plugin_settings

if TYPE_CHECKING:
    from plugins.records import ComponentHost, ComponentInfo, PluginRecord

logger = logging.getLogger(__name__)

ROUTE_MESSAGE = "host.route_message"
UPDATE_STATE = "host.update_message_gateway_state"
HOST_METHODS = frozenset({ROUTE_MESSAGE, UPDATE_STATE})
GATEWAY_TIMEOUT = 30.0  # seconds a gateway's handler may take for one hand-over unless it declares timeout_ms
ROUTE_TYPES = {"duplex": (True, True), "send": (True, False), "receive": (False, True)}
_PLATFORM = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass
class GatewayEntry:
    """One registered gateway component, and the connection it has while it reports itself ready."""

    host: ComponentHost
    record: PluginRecord
    component: ComponentInfo
    process: Any  # the runner it was registered from
    platform: str  # declared ("" : the gateway reports it)
    sends: bool
    receives: bool
    accept: list[str] = field(default_factory=lambda: list(GATEWAY_ACCEPT_FORMAT))
    timeout: float = GATEWAY_TIMEOUT
    conn: PluginGatewayConnection | None = None
    scope: str = ""

    @property
    def name(self) -> str:
        return self.component.name


# (plugin id, gateway name) -> entry; touched on the host's loop and from registration threads (whole-dict
# swaps under the GIL are enough: readers only look one entry up).
_entries: dict[tuple[str, str], GatewayEntry] = {}
# Plugin ids whose gateways were (re)registered: waiters for a runner still loading.
_registered: dict[str, asyncio.Event] = {}
# Plugin id -> (the host's loop, the lock its gateways' state reports take turns on).
_turns: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Lock]] = {}


def register(host: ComponentHost, record: PluginRecord, component: ComponentInfo) -> str:
    """Register a MESSAGE_GATEWAY component; "" when registered, else why not (the component's note)."""
    manifest = record.manifest
    if manifest is None or manifest.plugin_type != "adapter":
        return 'message gateways are for adapter plugins (manifest plugin_type "adapter")'
    meta = component.metadata
    route_type = str(meta.get("route_type") or "").strip().lower()
    if route_type not in ROUTE_TYPES:
        return f"unknown route_type {route_type!r} (duplex, send or receive)"
    platform = str(meta.get("platform") or "").strip()
    if platform and (not _PLATFORM.fullmatch(platform) or platform == WEB_PLATFORM):
        return f"platform {platform!r} cannot be an adapter's"
    sends, receives = ROUTE_TYPES[route_type]
    entry = GatewayEntry(host, record, component, record.process, platform, sends, receives)
    accept = meta.get("accept_format")
    if isinstance(accept, list) and accept and all(isinstance(a, str) for a in accept):
        entry.accept = [a for a in accept if a != "command"]
    timeout_ms = meta.get("timeout_ms")
    if isinstance(timeout_ms, int | float) and not isinstance(timeout_ms, bool) and timeout_ms > 0:
        entry.timeout = min(float(timeout_ms) / 1000, 300.0)
    key = (record.plugin_id, component.name)
    _entries[key] = entry
    host.on_unregister(lambda: _drop(key, entry))
    _announce(host, record.plugin_id)
    return ""


def _announce(host: ComponentHost, plugin_id: str) -> None:
    loop = getattr(host, "loop", None)
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(lambda: _registered.setdefault(plugin_id, asyncio.Event()).set())


def _drop(key: tuple[str, str], entry: GatewayEntry) -> None:
    """Unregistered (plugin unloaded, reloaded, crashed): its connection ends, its rows wait."""
    if _entries.get(key) is entry:
        del _entries[key]
    conn, entry.conn = entry.conn, None
    if conn is not None:
        aio.submit(_disconnect(entry, conn))


async def _disconnect(entry: GatewayEntry, conn: PluginGatewayConnection) -> None:
    try:
        await plugin_gateway_disconnect(conn)
    except GatewayUnavailable:
        pass
    except Exception:
        logger.exception("gateway %s of plugin %s: ending its connection failed", entry.name, entry.record.plugin_id)


def runner_exited(plugin_id: str, process: Any) -> None:
    """A plugin's runner died: its gateways' connections end now (their rows wait for a restarted runner
    to report ready), not when the restart unregisters them."""
    for entry in gateways_of(plugin_id):
        conn = entry.conn
        if entry.process is process and conn is not None:
            entry.conn = None
            aio.submit(_disconnect(entry, conn))


def gateways_of(plugin_id: str) -> list[GatewayEntry]:
    return [e for (pid, _), e in list(_entries.items()) if pid == plugin_id]


async def host_method(record: PluginRecord, caller: Any, method: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Answer a raw host call of a gateway's plugin (`caller`: the runner it came from)."""
    try:
        if method == UPDATE_STATE:
            return await _update_state(record, caller, StateUpdate.model_validate(payload))
        return await _route_message(record, caller, RouteMessage.model_validate(payload))
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "payload"
        reason = f"{method}: malformed payload: {where}: {first['msg']}"
    except (PermissionError, ValueError, GatewayUnavailable) as exc:
        reason = f"{method}: {exc}"
    record.error(reason[:500])
    logger.warning("plugin %s: %s", record.plugin_id, reason)
    raise PermissionError(reason)


async def _entry(record: PluginRecord, caller: Any, name: str) -> GatewayEntry:
    """The gateway `name` (or the plugin's only one) that `caller` may speak for."""

    def find() -> GatewayEntry | None:
        if name:
            return _entries.get((record.plugin_id, name))
        found = gateways_of(record.plugin_id)
        return found[0] if len(found) == 1 else None

    if getattr(caller, "stopping", False):
        raise PermissionError("this runner is being stopped (the plugin was reloaded, disabled or unloaded)")
    entry = find()
    adapter = record.manifest is not None and record.manifest.plugin_type == "adapter"
    if (entry is None or entry.process is not caller) and adapter and caller is not record.process:
        # Its runner is still loading (on_load reports before the host has its components): wait for them.
        event = _registered.setdefault(record.plugin_id, asyncio.Event())
        try:
            async with asyncio.timeout(plugin_settings().load_timeout):
                while True:
                    event.clear()  # before looking: a registration after the look sets it again
                    if (entry := find()) is not None and entry.process is caller:
                        break
                    await event.wait()
        except TimeoutError:
            entry = find()
    if entry is None:
        raise PermissionError(f"plugin {record.plugin_id} declares no message gateway {name or '(unnamed)'}")
    if entry.process is not caller:
        raise PermissionError("this runner is no longer the plugin's (it was reloaded or restarted)")
    return entry


def _platform(entry: GatewayEntry, reported: str) -> str:
    platform = reported.strip() or entry.platform
    if entry.platform and platform != entry.platform:
        raise PermissionError(f"gateway {entry.name} is declared for platform {entry.platform}, not {platform}")
    if not platform:
        raise ValueError(f"gateway {entry.name} names no platform (in its declaration or its state)")
    if not _PLATFORM.fullmatch(platform) or platform == WEB_PLATFORM:
        raise PermissionError(f"platform {platform!r} cannot be an adapter's")
    return platform


def _turn(plugin_id: str) -> asyncio.Lock:
    """The lock a plugin's state reports take turns on (one per plugin, on the host's running loop)."""
    loop = asyncio.get_running_loop()
    held = _turns.get(plugin_id)
    if held is None or held[0] is not loop:
        held = _turns[plugin_id] = (loop, asyncio.Lock())
    return held[1]


async def _update_state(record: PluginRecord, caller: Any, update: StateUpdate) -> dict[str, Any]:
    """One state report, handled and answered after the plugin's earlier ones (module docstring)."""
    if not update.ready and getattr(caller, "stopping", False):
        # A runner being stopped reports its gateway down from on_unload: its gateways are (or are being)
        # unregistered anyway, and a newer runner's must not be touched.
        return {"accepted": True, "ready": False, "route_key": {}}
    async with _turn(record.plugin_id):  # FIFO: in the order the runner's calls arrived
        return await _apply_state(record, caller, update)


async def _apply_state(record: PluginRecord, caller: Any, update: StateUpdate) -> dict[str, Any]:
    entry = await _entry(record, caller, update.gateway_name)
    old = entry.conn
    if not update.ready:
        entry.conn = None
        if old is not None:
            await _disconnect(entry, old)
            logger.info("gateway %s of plugin %s: not ready", entry.name, record.plugin_id)
        return {"accepted": True, "ready": False, "route_key": {}}
    platform = _platform(entry, update.platform)
    account = update.account_id.strip()
    route_key = {"platform": platform, "account_id": account or None, "scope": update.scope.strip() or None}
    if old is not None and not old.closed and (old.platform, old.account) == (platform, account):
        return {"accepted": True, "ready": True, "route_key": route_key}  # already so
    where = str(update.metadata.get("ws_url") or "")[:120]
    conn = PluginGatewayConnection(
        platform=platform,
        remote=f"plugin {record.plugin_id}/{entry.name}" + (f" → {where}" if where else ""),
        account=account,
        accept=list(entry.accept),
        call=lambda frame: _hand_over(entry, frame),
        sends=entry.sends,
    )
    entry.conn, entry.scope = conn, update.scope.strip()
    if old is not None:
        await _disconnect(entry, old)
    await plugin_gateway_connect(conn)
    logger.info(
        "gateway %s of plugin %s ready: platform %s, account %s", entry.name, record.plugin_id, platform, account or "?"
    )
    return {"accepted": True, "ready": True, "route_key": route_key}


async def _route_message(record: PluginRecord, caller: Any, routed: RouteMessage) -> dict[str, Any]:
    entry = await _entry(record, caller, routed.gateway_name)
    if not entry.receives:
        raise PermissionError(f"gateway {entry.name} is declared send-only")
    size = await asyncio.to_thread(message_size, routed.message)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"message of {size} bytes (at most {MAX_MESSAGE_BYTES})")
    conn = entry.conn
    if conn is None:
        raise PermissionError(f"gateway {entry.name} is not ready: report its state first")
    message = MessageDict.model_validate(routed.message)
    claimed = {message.platform, str(routed.route_metadata.get("platform") or "") or message.platform}
    if claimed != {conn.platform}:
        raise PermissionError(f"message for platform {', '.join(sorted(claimed))}, not the gateway's {conn.platform}")
    metadata = routed.route_metadata
    envelope = inbound_envelope(message, platform=conn.platform, account=conn.account, route_metadata=metadata)
    key = routed.dedupe_key or routed.external_message_id or message.message_id
    mentioned = message.is_mentioned is True or message.is_at is True
    why = await plugin_gateway_route(conn, envelope, dedupe_key=key, mentioned=mentioned)
    route_key = {"platform": conn.platform, "account_id": conn.account or None, "scope": entry.scope or None}
    if why.startswith("not a message") or why.startswith("it names platform"):
        raise ValueError(why)
    if why:
        logger.info("plugin %s: message %s not taken: %s", record.plugin_id, message.message_id, why)
    return {"accepted": not why, "route_key": route_key}


async def _hand_over(entry: GatewayEntry, frame: dict[str, Any]) -> Answered:
    """Hand one outbound envelope to the gateway's handler; its answer (chat.outbox_rows.Answered)."""
    conn = entry.conn
    if not entry.sends:
        return Answered(False, reason=f"gateway {entry.name} is declared receive-only")
    account = conn.account if conn is not None else ""
    route = {"platform": frame["message_info"]["platform"], "account_id": account or None, "scope": entry.scope or None}
    args = {"message": outbound_message(frame, account=account, scope=entry.scope), "route": route, "metadata": {}}
    try:
        result = await entry.host.ainvoke(entry.record, entry.component, args, entry.timeout)
    except TimeoutError:
        return Answered(False, reason=f"the gateway did not answer within {entry.timeout:g}s")
    except Exception as exc:
        return Answered(False, reason=f"{type(exc).__name__}: {exc}"[:200])
    return answer_of(result)


def answer_of(result: Any) -> Answered:
    """A gateway handler's result as a row's fate (MaiBot's PluginPlatformDriver._build_receipt)."""
    if isinstance(result, dict):
        if result.get("success") is False:
            return Answered(False, reason=str(result.get("error") or "the gateway could not send")[:200])
        platform_id = result.get("external_message_id") or result.get("message_id") or ""
        return Answered(True, platform_id=str(platform_id)[:128])
    if isinstance(result, str) and result.strip():
        return Answered(True, platform_id=result.strip()[:128])
    return Answered(True)
