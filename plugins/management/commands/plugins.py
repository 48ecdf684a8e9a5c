"""`manage.py plugins install-deps [PLUGIN ...]`: pip-install the plugins' missing Python dependencies
into the bot's own environment (the same as the admin's "install-deps" action)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from plugins import deps
from plugins import manifest as mf
from plugins.host import plugins_dir


class Command(BaseCommand):
    help = "Plugin operations: install-deps [PLUGIN ...] installs missing Python dependencies (pip)."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="operation", required=True)
        install = sub.add_parser("install-deps", help="pip-install the missing Python dependencies of plugins")
        install.add_argument("plugin", nargs="*", help="plugin ids or folder names (default: every plugin)")

    def handle(self, *args, operation: str, plugin: list[str], **options) -> None:
        directory = plugins_dir()
        if not directory.is_dir():
            raise CommandError(f"no plugins directory at {directory}")
        wanted = set(plugin)
        found: set[str] = set()
        failed = False
        for folder in sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            try:
                manifest = mf.read_manifest(folder)
            except mf.ManifestError as exc:
                if not wanted or folder.name in wanted:
                    self.stderr.write(f"{folder.name}: skipped, {exc}")
                continue
            if wanted and not wanted & {manifest.id, folder.name}:
                continue
            found |= {manifest.id, folder.name}
            requirements = deps.missing_requirements(manifest)
            if not requirements:
                self.stdout.write(f"{manifest.id}: every Python dependency is installed")
                continue
            outcome = deps.install(requirements)
            self.stdout.write(f"{manifest.id}: {outcome.summary}")
            if not outcome.ok:
                failed = True
                self.stderr.write(outcome.output)
        if missing := sorted(wanted - found):
            raise CommandError(f"no such plugin: {', '.join(missing)}")
        if failed:
            raise CommandError("some dependencies could not be installed")
        self.stdout.write("Reload the plugins (admin, or restart the server) to load them.")
