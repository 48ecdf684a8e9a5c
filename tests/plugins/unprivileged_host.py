"""Run by test_sandbox as a non-root user: a plugin host (the real one) loading the hostile plugin from
$MAIBOT_DATA_DIR/plugins, its probe's findings and whether its daemon outlived the host, as JSON on
stdout. A server that does not run as root sandboxes its plugins in a user namespace of bwrap's."""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402

from plugins.host import PluginHost  # noqa: E402


def marked(marker: str) -> bool:
    for entry in Path("/proc").iterdir():
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def main() -> None:
    marker = os.environ["HOSTILE_MARKER"]  # not in our own command line, which `marked` reads
    host = PluginHost()
    host.load_all(Path(settings.DATA_DIR) / "plugins")
    record = host.records["test.maibot.hostile"]
    out = {"uid": os.getuid(), "state": str(record.state), "reason": record.reason, "sandbox": record.sandbox}
    if record.process is not None:
        tools = {c.name: c for c in record.components}
        out["findings"] = host.invoke(record, tools["hostile_probe"], {}, 60)
        host.invoke(record, tools["hostile_daemon"], {"marker": marker}, 60)
        deadline = time.monotonic() + 20
        while not marked(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        out["daemon_started"] = marked(marker)
    host.stop()
    deadline = time.monotonic() + 20
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    out["daemon_left"] = marked(marker)
    out["secret_key"] = (Path(settings.DATA_DIR) / "secret_key").read_text().strip()
    print("RESULT " + json.dumps(out), flush=True)


main()
