"""Installing plugins' Python dependencies: pip into the bot's own environment (`sys.executable -m pip`).

An operator action (admin button, `manage.py plugins install-deps`) or automatic at load with
`plugins.auto_install_dependencies = true`. Each outcome is logged and kept on the plugin's record.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
import time
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet

from plugins import manifest as mf

logger = logging.getLogger(__name__)

MAX_OUTPUT = 8000  # characters of pip's output kept for the admin


@dataclass
class InstallOutcome:
    ok: bool
    requirements: list[str]
    output: str
    at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def summary(self) -> str:
        what = ", ".join(self.requirements) or "nothing"
        return f"{'installed' if self.ok else 'installing failed'}: {what}"


def missing_requirements(manifest: mf.Manifest) -> list[str]:
    """The package dependencies this environment does not satisfy, as pip requirements."""
    from importlib import metadata

    wanted = []
    for dep in manifest.package_dependencies:
        try:
            installed = metadata.version(dep.name)
        except metadata.PackageNotFoundError:
            wanted.append(f"{dep.name}{dep.version_spec}")
            continue
        if not SpecifierSet(dep.version_spec, prereleases=True).contains(installed, prereleases=True):
            wanted.append(f"{dep.name}{dep.version_spec}")
    return wanted


def install(requirements: list[str]) -> InstallOutcome:
    """pip install `requirements` (plus `plugins.pip_args`) with the bot's interpreter, bounded in time."""
    from maibot.config import get_config

    settings = get_config().plugins
    if not requirements:
        return InstallOutcome(True, [], "nothing to install")
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        *settings.pip_args,
        "--",
        *requirements,
    ]
    logger.info("installing plugin dependencies: %s", " ".join(requirements))
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=settings.install_timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        outcome = InstallOutcome(False, requirements, f"pip did not finish within {settings.install_timeout:g}s")
    except OSError as exc:
        outcome = InstallOutcome(False, requirements, f"pip could not run: {exc}")
    else:
        output = (done.stdout + done.stderr).strip()
        outcome = InstallOutcome(done.returncode == 0, requirements, output[-MAX_OUTPUT:])
    importlib.invalidate_caches()  # importlib.metadata sees the new distributions
    (logger.info if outcome.ok else logger.error)("plugin dependencies %s\n%s", outcome.summary, outcome.output)
    return outcome
