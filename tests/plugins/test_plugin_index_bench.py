"""bench/plugin_index.py --compare keeps the snapshot's figures and the live index's in one output."""

from __future__ import annotations

import io
import json
import sys

from bench import plugin_index


def manifest(plugin_id: str, capabilities: list[str], max_version: str = "1.2.99") -> dict:
    return {
        "manifest_version": 2,
        "id": plugin_id,
        "version": "1.0.0",
        "name": plugin_id,
        "host_application": {"min_version": "1.0.0", "max_version": max_version},
        "sdk": {"min_version": "2.0.0", "max_version": "2.99.99"},
        "dependencies": [],
        "capabilities": capabilities,
    }


def test_compare_with_download_prints_the_snapshot_and_the_live_index(monkeypatch, capsys):
    live = [
        {"id": "live.ok", "manifest": manifest("live.ok", ["send.text"])},
        {"id": "live.old", "manifest": manifest("live.old", ["send.text"], max_version="1.0.0")},
        {"id": "live.video", "manifest": manifest("live.video", ["send.video"])},
    ]
    asked = []

    def urlopen(url, timeout):
        asked.append(url)
        return io.BytesIO(json.dumps(live).encode("utf-8"))

    monkeypatch.setattr(plugin_index.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(sys, "argv", ["plugin_index.py", "--compare", "--download"])
    plugin_index.main()
    out = capsys.readouterr().out

    assert asked == [plugin_index.INDEX_URL]
    snapshot, rest = out.split("== live index ", 1)
    assert "== stored snapshot (" in snapshot and "manifest-v2 plugins of 294 entries" in snapshot
    assert rest.startswith(f"{plugin_index.INDEX_URL}: 3 manifest-v2 plugins of 3 entries")
    assert rest.count("load with every declared capability answered: 1 of 3") == 2  # MaiBot's rules, ours
    assert "live.old: host_application: host_application allows MaiBot up to 1.0.0" in rest
    assert "live.video: capabilities not answered: send.video" in rest
