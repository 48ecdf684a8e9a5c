"""Installing plugins' Python dependencies: pip into the bot's own environment (`sys.executable -m pip`).

An operator action (admin button, `manage.py plugins install-deps`), or automatic at load when the
deployment sets MAIBOT_PLUGIN_AUTO_INSTALL. What may be installed, and from where, is never the bot
config's to say (whoever may edit it must not be able to run code with it):

- the requirements are the manifest's package dependencies only, each validated as a plain requirement
  on the package index (plugins.manifest refuses URLs and paths; names are passed canonical, so none
  reads as a file or an option), after `--` on an argument list built here (no shell);
- the index is the deployment's: MAIBOT_PIP_INDEX_URL / MAIBOT_PIP_EXTRA_INDEX_URL, else pip's own
  configuration of the server's user;
- wheels only (`--only-binary=:all:`): no package's build script (setup.py) runs at install time;
- packages already installed keep their versions (a constraints file pins every installed
  distribution): a plugin adds packages, it never up- or downgrades one the bot runs on;
- pip runs in an empty folder with an environment holding no secret of the server's (only PATH, locale,
  proxies, certificates and pip's own PIP_* settings).

The outcome's one-line summary is logged and shown with the plugin; pip's own output is kept on the
plugin's record, shown to superusers only, and never logged (the live log page is read by every
operator with the console permission).
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from django.conf import settings
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from plugins import manifest as mf
from plugins.supervisor import safe_environment

logger = logging.getLogger(__name__)

MAX_OUTPUT = 8000  # characters of pip's output kept for the admin


@dataclass
class InstallOutcome:
    ok: bool
    requirements: list[str]
    output: str  # pip's own output: for superusers only (see the module's docstring)
    at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    reason: str = ""  # why it failed, in one line without pip's output

    @property
    def summary(self) -> str:
        what = ", ".join(self.requirements) or "nothing"
        if self.ok:
            return f"installed: {what}"
        return f"installing failed: {what}" + (f" ({self.reason})" if self.reason else "")


def auto_install_enabled() -> bool:
    """Whether a plugin's missing packages are installed at load (the deployment's MAIBOT_PLUGIN_AUTO_INSTALL)."""
    return settings.MAIBOT_PLUGIN_AUTO_INSTALL


def missing_requirements(manifest: mf.Manifest) -> list[str]:
    """The package dependencies this environment does not satisfy, as pip requirements."""
    return [str(u.dependency.requirement) for u in mf.unsatisfied_packages(manifest)]


def pip_command(requirements: list[str], *, constraints: Path) -> list[str]:
    """The argument list pip runs with: fixed options, the deployment's index, `--`, the requirements."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--only-binary=:all:",
        "--constraint",
        str(constraints),
    ]
    if settings.MAIBOT_PIP_INDEX_URL:
        command += ["--index-url", settings.MAIBOT_PIP_INDEX_URL]
    for url in settings.MAIBOT_PIP_EXTRA_INDEX_URLS:
        command += ["--extra-index-url", url]
    return [*command, "--", *requirements]


def installed_pins() -> list[str]:
    """`name==version` of every installed distribution (the first of each name on sys.path, the one
    imported), for pip's constraints file."""
    pins: dict[str, str] = {}
    for dist in metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if name and version and canonicalize_name(name) not in pins:
            pins[canonicalize_name(name)] = f"{canonicalize_name(name)}=={version}"
    return sorted(pins.values())


def _pip_environment() -> dict[str, str]:
    # The basics every program the host starts gets, where pip installs to, and pip's own settings.
    return safe_environment(also=("PYTHONPATH", "VIRTUAL_ENV"), prefixes=("PIP_",))


def install(requirements: list[str]) -> InstallOutcome:
    """pip install `requirements` (from `missing_requirements`) with the bot's interpreter, bounded in
    time. A requirement whose package is installed at another version is refused without running pip."""
    timeout = _install_timeout()
    if not requirements:
        return InstallOutcome(True, [], "nothing to install")
    installed = {}
    for requirement in requirements:
        try:
            parsed = Requirement(requirement)
        except InvalidRequirement:
            parsed = None
        if parsed is None or parsed.url is not None or str(parsed) != requirement:
            # missing_requirements() never gives one; a caller that builds its own is refused.
            reason = f"not a plain requirement on the package index: {requirement!r}"
            return _finish(InstallOutcome(False, requirements, reason, reason=reason))
        try:
            installed[requirement] = metadata.version(parsed.name)
        except metadata.PackageNotFoundError:
            pass
    if installed:
        held = ", ".join(f"{r} (installed: {v})" for r, v in installed.items())
        reason = f"already installed at another version, which a plugin may not change: {held}"
        return _finish(InstallOutcome(False, requirements, reason, reason=reason))
    logger.info("installing plugin dependencies: %s", ", ".join(requirements))
    with tempfile.TemporaryDirectory(prefix="maibot-pip-") as folder:
        constraints = Path(folder) / "installed.txt"
        constraints.write_text("\n".join(installed_pins()) + "\n", encoding="utf-8")
        try:
            done = subprocess.run(
                pip_command(requirements, constraints=constraints),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                cwd=folder,  # nothing here that a requirement could name as a local file
                env=_pip_environment(),
            )
        except subprocess.TimeoutExpired:
            reason = f"pip did not finish within {timeout:g}s"
            outcome = InstallOutcome(False, requirements, reason, reason=reason)
        except OSError as exc:
            reason = f"pip could not run: {exc}"
            outcome = InstallOutcome(False, requirements, reason, reason=reason)
        else:
            output = (done.stdout + done.stderr).strip()
            reason = "" if done.returncode == 0 else f"pip exited with status {done.returncode}"
            outcome = InstallOutcome(done.returncode == 0, requirements, output[-MAX_OUTPUT:], reason=reason)
    importlib.invalidate_caches()  # importlib.metadata sees the new distributions
    return _finish(outcome)


def _install_timeout() -> float:
    from core.config import get_config

    return get_config().plugins.install_timeout


def _finish(outcome: InstallOutcome) -> InstallOutcome:
    # The summary only: pip's output may quote what it was given, and the log is read more widely.
    (logger.info if outcome.ok else logger.error)("plugin dependencies %s", outcome.summary)
    return outcome
