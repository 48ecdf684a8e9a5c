"""The tool cache of the design note ("工具结果的缓存设计"): per plugin component, results with an expiry.

A plugin marks a tool cacheable in its declaration (the SDK passes extra keywords through as metadata):

    @Tool("weather", description="...", parameters=[...], need_cache=True, cache_ttl=1800)

* `need_cache` (the design note's name): only then does the component get a cache space.
* `cache_ttl`: seconds a result is answered from the cache (default 300; 1 to 86,400).
* `cache_scope`: "global" (default: the same arguments in any chat hit the same entry) or "chat"
  (entries are per chat stream).

A call with the same model arguments within the TTL is answered from the cache without calling the
plugin, and recorded like any tool call with `"cached": true` in its result (the ToolCallRecord and the
model both see it). Only successful results are kept; each component keeps at most MAX_ENTRIES (the
oldest go first). A plugin's cache is dropped when it is unloaded or reloaded.

`put_cache` / `get_cache` are the design note's operations, keyed by (plugin id, component name) and the
call's arguments; the bridge uses them, and so can the host's other code.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

DEFAULT_TTL = 300.0
MIN_TTL = 1.0
MAX_TTL = 86_400.0
MAX_ENTRIES = 256  # per component
SCOPES = ("global", "chat")

# The clock the expiry is read from (tests inject a FakeClock).
clock: Callable[[], datetime] = timezone.now

_MISS = object()


@dataclass(frozen=True)
class CachePolicy:
    ttl: float
    scope: str  # "global" | "chat"


def policy(metadata: dict[str, Any]) -> CachePolicy | str | None:
    """The component's cache policy from its declaration: None when it is not cacheable, a string
    saying what is wrong with the declaration (the component is then registered without a cache)."""
    if not metadata.get("need_cache"):
        return None
    raw_ttl = metadata.get("cache_ttl", DEFAULT_TTL)
    try:
        ttl = float(raw_ttl)
    except (TypeError, ValueError):
        return f"cache_ttl {raw_ttl!r} is not a number of seconds"
    if not MIN_TTL <= ttl <= MAX_TTL:
        return f"cache_ttl must be between {MIN_TTL:g} and {MAX_TTL:g} seconds, not {raw_ttl!r}"
    scope = str(metadata.get("cache_scope") or "global")
    if scope not in SCOPES:
        return f"cache_scope must be one of {', '.join(SCOPES)}, not {scope!r}"
    return CachePolicy(ttl=ttl, scope=scope)


def cache_key(arguments: dict[str, Any], stream_id: str = "") -> str:
    return json.dumps([stream_id, arguments], sort_keys=True, ensure_ascii=False, default=str)


class ComponentCache:
    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[datetime, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Any:
        now = clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] <= now:
                if entry is not None:
                    del self._entries[key]
                self.misses += 1
                return _MISS
            self.hits += 1
            return entry[1]

    def put(self, key: str, value: Any, ttl: float) -> None:
        expires = clock() + timedelta(seconds=ttl)
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = (expires, value)
            while len(self._entries) > MAX_ENTRIES:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


_caches: dict[tuple[str, str], ComponentCache] = {}
_lock = threading.Lock()


def component_cache(plugin_id: str, component_name: str) -> ComponentCache:
    with _lock:
        return _caches.setdefault((plugin_id, component_name), ComponentCache())


def drop(plugin_id: str, component_name: str) -> None:
    with _lock:
        _caches.pop((plugin_id, component_name), None)


def put_cache(plugin_id: str, component_name: str, arguments: dict[str, Any], value: Any, *, ttl: float) -> None:
    component_cache(plugin_id, component_name).put(cache_key(arguments), value, ttl)


def get_cache(plugin_id: str, component_name: str, arguments: dict[str, Any], default: Any = None) -> Any:
    value = component_cache(plugin_id, component_name).get(cache_key(arguments))
    return default if value is _MISS else value


def lookup(cache: ComponentCache, key: str) -> tuple[bool, Any]:
    value = cache.get(key)
    return (False, None) if value is _MISS else (True, value)
