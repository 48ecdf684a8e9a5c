"""Installing a plugin from a git URL (the console's "git URL" field; plugins.install does the rest).

Only `https://host/…` URLs (`MAIBOT_PLUGIN_INSTALL_GIT_SCHEMES`; a test's local server adds http): no
file://, ssh, git://, `ext::` or other transport, no local path, no user name or password in the URL, no
option (`-…`). git runs with no configuration but this one (no system or user config, no templates, no
hooks, no credential helper, no prompt), `GIT_ALLOW_PROTOCOL` naming the accepted schemes (which also
binds the transports a redirect or a submodule could name), redirects not followed at all, objects
checked (`transfer.fsckObjects`), a shallow clone of the default branch without tags or submodules,
within `MAIBOT_PLUGIN_INSTALL_GIT_TIMEOUT` seconds and `MAIBOT_PLUGIN_INSTALL_MAX_UNPACKED` bytes (the
clone is watched and killed past either). A repository with a symlink is refused; the checkout, without
its .git, must then pass what a zip's contents pass (plugins.install.check_tree) and the manifest check."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.utils.translation import gettext as _

from plugins.install import Installed, InstallError, Limits, Place, check_tree, limits, mib, move_in, staging

MAX_URL = 2000
# What git gets of the server's environment: finding programs, proxies and certificates; nothing else.
KEPT_ENV = ("PATH", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
KEPT_ENV_PREFIXES = ("SSL_CERT_", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH")
POLL = 0.2


def schemes() -> tuple[str, ...]:
    return tuple(s.lower() for s in settings.MAIBOT_PLUGIN_INSTALL_GIT_SCHEMES)


def check_url(url: str) -> str:
    """The URL, stripped, if git may fetch it; InstallError saying why not."""
    url = url.strip()
    allowed = schemes()
    only = _("Only %(schemes)s URLs of a git server are accepted (e.g. https://github.com/owner/plugin.git).") % {
        "schemes": ", ".join(f"{s}://" for s in allowed)
    }
    if not url or len(url) > MAX_URL or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise InstallError(_("Refused: the git URL is empty, too long or has spaces or control characters."))
    if url.startswith("-") or "::" in url.split("/", 1)[0]:
        raise InstallError(_("Refused: %(url)s is not a URL git may fetch. ") % {"url": url} + only)
    parts = urlsplit(url)
    if parts.scheme.lower() not in allowed or not parts.hostname:
        raise InstallError(_("Refused: %(url)s is not a URL git may fetch. ") % {"url": url} + only)
    if parts.username or parts.password:
        raise InstallError(_("Refused: the git URL must not hold a user name or password."))
    return url


def git_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in KEPT_ENV or k.startswith(KEPT_ENV_PREFIXES)}
    env.update(
        HOME=str(home),
        LANG="C",
        LC_ALL="C",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_ASKPASS="/bin/false",
        SSH_ASKPASS="/bin/false",
        GIT_ALLOW_PROTOCOL=":".join(schemes()),
        GIT_PROTOCOL_FROM_USER="0",
        GIT_LFS_SKIP_SMUDGE="1",
    )
    return env


def clone_argv(url: str, dest: Path) -> list[str]:
    options = {
        "protocol.allow": "never",
        **{f"protocol.{s}.allow": "always" for s in schemes()},
        "http.followRedirects": "false",
        "core.hooksPath": os.devnull,
        "core.symlinks": "false",
        "core.fsmonitor": "false",
        "credential.helper": "",
        "submodule.recurse": "false",
        "transfer.fsckObjects": "true",
        "init.templateDir": "",
    }
    configs = [arg for key, value in options.items() for arg in ("-c", f"{key}={value}")]
    clone = ["clone", "--quiet", "--depth=1", "--single-branch", "--no-tags", "--no-recurse-submodules", "--template="]
    return ["git", *configs, *clone, "--", url, str(dest)]


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_clone(url: str, dest: Path, home: Path, lim: Limits) -> None:
    """git clone, watched: killed past the time or size limit; InstallError with git's own reason."""
    if shutil.which("git") is None:
        raise InstallError(_("git is not installed on the server: install it, or upload a zip."))
    argv = clone_argv(url, dest)
    proc = subprocess.Popen(
        argv, env=git_env(home), cwd=home, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + lim.git_timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            _kill(proc)
            why = _("Refused: git clone took more than %(seconds)g seconds.")
            raise InstallError(why % {"seconds": lim.git_timeout})
        if _size(dest) > lim.unpacked_bytes * 2:  # the objects and the checkout: twice the plugin at most
            _kill(proc)
            why = _("Refused: the repository is larger than %(limit)s.")
            raise InstallError(why % {"limit": mib(lim.unpacked_bytes)})
        time.sleep(POLL)
    error = proc.stderr.read().decode("utf-8", "replace").strip()[-1000:] if proc.stderr else ""
    if proc.returncode != 0:
        raise InstallError(_("git clone failed: %(error)s") % {"error": error or proc.returncode})


def _git_output(dest: Path, home: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(dest), *args], env=git_env(home), capture_output=True, timeout=60, check=True
    )
    return done.stdout.decode("utf-8", "replace")


def checked_checkout(dest: Path, home: Path) -> str:
    """The checkout's commit; InstallError when it holds a symlink (core.symlinks=false wrote it as a file)."""
    listing = _git_output(dest, home, "ls-tree", "-r", "-z", "--full-tree", "HEAD")
    for entry in filter(None, listing.split("\0")):
        meta, _tab, path = entry.partition("\t")
        if meta.startswith("120000"):
            raise InstallError(_("Refused: the repository holds a symbolic link: %(name)s.") % {"name": path})
    return _git_output(dest, home, "rev-parse", "HEAD").strip()


def install_git(url: str, place: Place = move_in) -> Installed:
    """Clone the plugin at `url` and install it; `place` puts the checked checkout in."""
    url = check_url(url)
    lim = limits()
    with staging() as stage:
        home, dest = stage / "home", stage / "plugin"
        home.mkdir(mode=0o700)
        run_clone(url, dest, home, lim)
        try:
            commit = checked_checkout(dest, home)
        except (subprocess.SubprocessError, OSError) as exc:
            raise InstallError(_("Refused: the clone cannot be read (%(error)s).") % {"error": exc}) from None
        shutil.rmtree(dest / ".git")
        check_tree(dest, lim)
        for path in [dest, *dest.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644, follow_symlinks=False)
        installed = place(dest)
    installed.revision = commit
    return installed
