"""Figures: how many of MaiBot's public plugin index would load here, and how many use only the
capabilities this host answers.

The index is Mai-with-u/plugin-repo's `plugin_details.json` (each entry: the plugin's id and its
`_manifest.json`). bench/data/plugin_index_manifests.json keeps the manifest FIELDS this needs (id,
versions, host_application and sdk ranges, dependencies, capabilities; no code, no descriptions) of
the snapshot named in its `source`; `--download` reads the live index instead, `--extract FILE`
rewrites the snapshot from a downloaded plugin_details.json.

Each manifest goes through the host's own checks (plugins.manifest: the manifest model, then
host_application against the MaiBot version we declare and the sdk range against the installed
maibot-plugin-sdk), exactly as a plugin folder would at load. Python package and plugin dependencies
are counted, not checked (they depend on the operator's environment and on which plugins are there).

With `--compare` it prints, for the stored snapshot, for each `--index FILE` (a plugin_details.json,
e.g. the newest fetched Mai-with-u/plugin-repo) and with `--download` for the live index, how many
manifest-v2 plugins load and have every declared capability answered under MaiBot's own rules
(bench/data/maibot_rules.json: its host version, the same version rule as ours (in range, or newer only
in the patch number: compatibility mode), and its capability registry) and under ours, then every v2
plugin that does not, with the reason. Event and hook subscriptions are not in the index's manifests
(they are in each plugin's code), so they are not counted here; docs/plugins.md lists the hook points
each host emits.

    .venv/bin/python bench/plugin_index.py [--download] [--top 30] [--host-version 1.0.0]
    .venv/bin/python bench/plugin_index.py --compare [--index plugin_details.json ...] [--download]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SNAPSHOT = ROOT / "bench" / "data" / "plugin_index_manifests.json"
MAIBOT_RULES = ROOT / "bench" / "data" / "maibot_rules.json"
INDEX_URL = "https://raw.githubusercontent.com/Mai-with-u/plugin-repo/main/plugin_details.json"
KEPT_FIELDS = ("manifest_version", "id", "version", "name", "host_application", "sdk", "dependencies", "capabilities")


def extract(details: list[dict]) -> list[dict]:
    """The fields kept of each index entry's manifest (the index's id kept as `index_id`)."""
    out = []
    for entry in details:
        manifest = entry.get("manifest") or {}
        kept = {k: manifest[k] for k in KEPT_FIELDS if k in manifest}
        if isinstance(kept.get("dependencies"), list):
            kept["dependencies"] = [
                {k: d[k] for k in ("type", "id", "name", "version_spec") if k in d}
                for d in kept["dependencies"]
                if isinstance(d, dict)
            ]
        out.append({"index_id": entry.get("id"), "manifest": kept})
    return out


def download() -> list[dict]:
    """The live index's entries (INDEX_URL), as extract() keeps them."""
    with urllib.request.urlopen(INDEX_URL, timeout=60) as response:
        return extract(json.loads(response.read().decode("utf-8")))


def verdict(manifest: dict, host_version: str) -> tuple[str, str]:
    """("loads" | "refused: <stage>", reason) by the host's own manifest checks."""
    from plugins import manifest as mf

    if manifest.get("manifest_version") != 2:
        return "refused: manifest_version", f"manifest_version {manifest.get('manifest_version')!r} (only 2)"
    try:
        parsed = mf.Manifest.model_validate(manifest)
    except Exception as exc:  # pydantic's ValidationError: the reason as the host words it
        return "refused: manifest", mf._validation_reason(exc) if hasattr(exc, "errors") else str(exc)
    try:
        mf.check_compatibility(parsed, host_version=host_version)
    except mf.ManifestError as exc:
        stage = "host_application" if "host_application" in str(exc) else "sdk"
        return f"refused: {stage}", str(exc)
    return "loads", ""


def report(entries: list[dict], host_version: str, top: int) -> None:
    from plugins.capabilities import SUPPORTED
    from plugins.manifest import sdk_version

    verdicts = [(e, *verdict(e["manifest"], host_version)) for e in entries]
    loads = [e for e, v, _ in verdicts if v == "loads"]
    v2 = [e for e in entries if e["manifest"].get("manifest_version") == 2]
    print(f"index entries: {len(entries)} (manifest_version 2: {len(v2)}, other: {len(entries) - len(v2)})")
    print(f"host declares MaiBot {host_version}; maibot-plugin-sdk installed: {sdk_version() or '(none)'}")
    print(f"load by manifest, host_application and sdk: {len(loads)} of {len(entries)} ({len(loads)} of {len(v2)} v2)")
    for stage, count in Counter(v for _, v, _ in verdicts if v != "loads").most_common():
        print(f"  {stage}: {count}")
    reasons = Counter(r for _, v, r in verdicts if v in ("refused: host_application", "refused: sdk"))
    for reason, count in reasons.most_common(6):
        print(f"    {count:4d}  {reason}")
    manifest_reasons = Counter(r for _, v, r in verdicts if v == "refused: manifest")
    for reason, count in manifest_reasons.most_common(5):
        print(f"    {count:4d}  {reason[:150]}")

    def caps(e: dict) -> list[str]:
        value = e["manifest"].get("capabilities") or []
        return [c for c in value if isinstance(c, str)]

    only_ours = [e for e in loads if set(caps(e)) <= SUPPORTED]
    print(f"of those that load, declaring only capabilities this host answers: {len(only_ours)} of {len(loads)}")
    missing_one = Counter()
    for e in loads:
        unanswered = sorted(set(caps(e)) - SUPPORTED)
        if len(unanswered) == 1:
            missing_one[unanswered[0]] += 1
    if missing_one:
        blocked = ", ".join(f"{c} ({n})" for c, n in missing_one.most_common(8))
        print(f"  one unanswered capability away: {blocked}")

    def needs(e: dict, kind: str) -> bool:
        return any(d.get("type") == kind for d in e["manifest"].get("dependencies") or [])

    with_pkgs = sum(1 for e in loads if needs(e, "python_package"))
    with_plugins = sum(1 for e in loads if needs(e, "plugin"))
    print(f"  of those that load: {with_pkgs} need Python packages, {with_plugins} other plugins (not checked here)")

    for label, group in (("all v2 manifests", v2), ("those that load", loads)):
        declared = Counter(c for e in group for c in set(caps(e)))
        print(f"\ntop {top} declared capabilities ({label}: {len(group)} plugins):")
        for capability, count in declared.most_common(top):
            mark = "answered" if capability in SUPPORTED else "NOT answered"
            print(f"  {count:4d}  {capability:36s} {mark}")

    print("\nload by host_application if the host declared another MaiBot version (sdk as installed):")
    for other in ("1.0.0", "1.1.0", "1.2.0", "1.3.0"):
        n = sum(1 for e in entries if verdict(e["manifest"], other)[0] == "loads")
        print(f"  MaiBot {other}: {n} of {len(entries)}")


def why_not(manifest: dict, host_version: str, answered: set[str] | frozenset[str]) -> str:
    """Why a v2 manifest does not load with every declared capability answered ("" when it does)."""
    state, reason = verdict(manifest, host_version)
    if state != "loads":
        return f"{state.removeprefix('refused: ')}: {reason}"
    declared = [c for c in manifest.get("capabilities") or [] if isinstance(c, str)]
    unanswered = sorted(set(declared) - set(answered))
    return f"capabilities not answered: {', '.join(unanswered)}" if unanswered else ""


def compare(label: str, entries: list[dict]) -> None:
    """Ours against MaiBot's rules on one index: the counts, then each v2 plugin that fails either."""
    from plugins.capabilities import SUPPORTED
    from plugins.manifest import HOST_APPLICATION_VERSION

    rules = json.loads(MAIBOT_RULES.read_text(encoding="utf-8"))
    maibot_caps = frozenset(rules["capabilities"])
    v2 = [e for e in entries if e["manifest"].get("manifest_version") == 2]
    rows = [
        (
            e,
            why_not(e["manifest"], rules["host_version"], maibot_caps),
            why_not(e["manifest"], HOST_APPLICATION_VERSION, SUPPORTED),
        )
        for e in v2
    ]
    theirs = sum(1 for _, m, _ in rows if not m)
    ours = sum(1 for _, _, o in rows if not o)
    print(f"\n== {label}: {len(v2)} manifest-v2 plugins of {len(entries)} entries")
    where = rules["source"].split(":")[0]
    print(f"MaiBot's rules ({where}; host {rules['host_version']}, {len(maibot_caps)} capabilities):")
    print(f"  load with every declared capability answered: {theirs} of {len(v2)}")
    print(f"ours (host declares MaiBot {HOST_APPLICATION_VERSION}, {len(SUPPORTED)} capabilities answered):")
    print(f"  load with every declared capability answered: {ours} of {len(v2)}")
    print("the rest (id: why, under both rules; or ours | MaiBot's):")
    for e, m, o in sorted(rows, key=lambda r: str(r[0].get("index_id"))):
        if m or o:
            print(f"  {e.get('index_id')}: {o}" if m == o else f"  {e.get('index_id')}: {o or 'ok'} | {m or 'ok'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    live = f"read the live index ({INDEX_URL}); with --compare: compare it too"
    parser.add_argument("--download", action="store_true", help=live)
    parser.add_argument("--extract", metavar="FILE", help="rewrite the snapshot from a plugin_details.json")
    parser.add_argument("--source", default="", help="with --extract: where FILE came from (kept in the snapshot)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--host-version", default="")
    parser.add_argument("--compare", action="store_true", help="ours against MaiBot's rules, with the rest listed")
    parser.add_argument("--index", action="append", default=[], help="with --compare: also this plugin_details.json")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")
    import django

    django.setup()
    from plugins.manifest import HOST_APPLICATION_VERSION

    if args.extract:
        entries = extract(json.loads(Path(args.extract).read_text(encoding="utf-8")))
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        snapshot = {"source": args.source or args.extract, "fields": list(KEPT_FIELDS), "entries": entries}
        SNAPSHOT.write_text(json.dumps(snapshot, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        print(f"wrote {len(entries)} entries to {SNAPSHOT.relative_to(ROOT)}")
        return
    if args.compare:
        snapshot = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
        compare(f"stored snapshot ({snapshot['source']})", snapshot["entries"])
        for path in args.index:
            compare(f"index {path}", extract(json.loads(Path(path).read_text(encoding="utf-8"))))
        if args.download:
            compare(f"live index {INDEX_URL}", download())
        return
    if args.download:
        entries = download()
        print(f"index: {INDEX_URL}")
    else:
        snapshot = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
        entries = snapshot["entries"]
        print(f"index: {snapshot['source']}")
    report(entries, args.host_version or HOST_APPLICATION_VERSION, args.top)


if __name__ == "__main__":
    main()
