"""A plugin record declaring some capabilities, and the real maibot-plugin-sdk's PluginContext over our
rpc_call: capability calls as a plugin makes them, answered in-process (no runner)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from plugins.capabilities import make_context
from plugins.manifest import Manifest
from plugins.records import PluginRecord


def plugin(plugin_id: str, capabilities: list[str]) -> tuple[PluginRecord, Any]:
    """(record, ctx): a plugin `plugin_id` whose manifest declares `capabilities`."""
    manifest = Manifest.model_validate(
        {
            "manifest_version": 2,
            "id": plugin_id,
            "version": "1.0.0",
            "name": plugin_id,
            "host_application": {"min_version": "1.0.0", "max_version": "1.99.99"},
            "sdk": {"min_version": "2.0.0", "max_version": "2.99.99"},
            "capabilities": capabilities,
        }
    )
    record = PluginRecord(folder=Path("/nonexistent"), plugin_id=plugin_id, manifest=manifest)
    return record, make_context(record)


def run(coro):
    return asyncio.run(coro)
