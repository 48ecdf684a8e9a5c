"""The plugin sandbox: a plugin's runner, and the browser of its renders, start inside bubblewrap (`bwrap`,
Debian's `bubblewrap`), so that plugin code cannot read the server's data or secrets, reach this machine's
loopback services, or leave a process behind.

The view (all a sandboxed process sees of the file system):
- read-only: /usr and the /bin, /lib… beside it; a few files of /etc (name resolution, TLS roots, time
  zone, fonts, the dynamic linker's cache); the Python installation, the virtualenv, every directory of the
  server's sys.path and the project (the runner's code); the plugin's own folder;
- writable: the plugin's data dir and runtime dir, and a private /tmp and /dev/shm (tmpfs, bounded);
- its own /proc (a pid namespace: no process outside the sandbox is visible) and a minimal /dev;
- the data dir, wherever a directory above contains it, is covered by an empty tmpfs: its database,
  secret_key, deployment.env, bot_config.toml, media and the other plugins' files are not there.
  Nothing of /run, /var, /home, /root, /srv, /mnt exists in it; /etc/passwd and /etc/group name only the
  sandbox's own user.

Who it runs as. A server running as root starts bwrap privileged (no user namespace) and setpriv
(util-linux) drops to a uid of the plugin's own (`plugin_uid`: a user that owns nothing on the host), with
no capabilities, no supplementary groups and no_new_privs, before Python starts. A server running as
another user gets a user namespace from bwrap: the plugin runs as that user, confined to the view.

Processes. The sandbox is a pid namespace whose init is bwrap's: when the runner exits or is killed, the
namespace ends and the kernel kills every process left in it (a double-forked, setsid daemon too);
--die-with-parent ends it when the server dies.

Network (`plugins.network`, per plugin in [[plugins.limits]]): "none" is a network namespace of its own
(its own loopback only); "isolated" is the same namespace connected to the internet by slirp4netns with
--disable-host-loopback (this machine's 127.0.0.1 and its loopback services are unreachable; DNS goes
through slirp's forwarder); "host" (a plugin the deployment lists in MAIBOT_PLUGIN_HOST_NETWORK) is the
server's own network. Without slirp4netns an "isolated" plugin has no network (the admin says so).

Without a working bwrap plugins are refused, unless the deployment sets MAIBOT_PLUGIN_SANDBOX=off.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.utils.translation import gettext, gettext_noop

from plugins import bwrap
from plugins.bwrap import program as _program

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # the runner's own code (plugins.runner)
# Uids of sandboxed plugins when the server runs as root: far above the users a host has (Debian
# allots up to 60000, rootless containers' subordinate ranges start at 100000). RENDER_UID runs browsers.
UID_BASE = 1_800_000_000
UID_SPAN = 1_000_000
RENDER_UID = UID_BASE
NS_GET_USERNS = 0xB701  # ioctl: the user namespace owning a namespace (linux/nsfs.h)
SLIRP_READY_TIMEOUT = 10.0


def enabled() -> bool:
    """Whether plugins must run sandboxed (MAIBOT_PLUGIN_SANDBOX is not "off")."""
    from django.conf import settings

    return settings.MAIBOT_PLUGIN_SANDBOX != "off"


def as_root() -> bool:
    return os.geteuid() == 0


def plugin_uid(plugin_id: str) -> int:
    """The uid a plugin's runner runs as when the server is root: its own, stable across restarts (its
    processes count against its own RLIMIT_NPROC, and it can touch no other plugin's process)."""
    return UID_BASE + 1 + zlib.crc32(plugin_id.encode("utf-8")) % (UID_SPAN - 1)


@dataclass(frozen=True)
class Support:
    """What this machine offers the sandbox, probed once per process."""

    problem: str = ""  # why sandboxed processes cannot start here ("" when they can)
    network: bool = False  # slirp4netns is installed: an isolated network is possible

    @property
    def ok(self) -> bool:
        return not self.problem


@functools.cache
def support() -> Support:
    """Probe once: bwrap (and setpriv as root) installed and a trial sandbox starting Python."""
    slirp = _program("slirp4netns") is not None
    if _program("bwrap") is None:
        return Support("bwrap is not installed (apt-get install bubblewrap)", slirp)
    if as_root() and _program("setpriv") is None:
        return Support("setpriv is not installed (apt-get install util-linux)", slirp)
    jail = Jail.build(
        command=[sys.executable, "-S", "-c", "pass"], uid=RENDER_UID, network="none", tmp_mb=1, visible=python_paths()
    )
    try:
        done = subprocess.run(
            jail.argv,
            pass_fds=jail.pass_fds,
            capture_output=True,
            timeout=30,
            env=jail.env({"PATH": "/usr/bin:/bin"}),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Support(f"bwrap could not start: {exc}", slirp)
    finally:
        jail.spawned()
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip()[-500:] or f"exit code {done.returncode}"
        return Support(f"bwrap cannot start a sandbox here ({why})", slirp)
    return Support("", slirp)


# Why plugins may not start (a record's reason, the log), and the admin's sentence about it.
REFUSAL = gettext_noop(
    "the plugin sandbox cannot run: %(problem)s. Plugins are not started without it; the deployment may run "
    "them unsandboxed with MAIBOT_PLUGIN_SANDBOX=off (they can then read everything the server can)"
)


def refusal() -> str:
    """Why plugins may not start ("" when they may): the sandbox is required but cannot run here."""
    if not enabled():
        return ""
    problem = support().problem
    return REFUSAL % {"problem": problem} if problem else ""


def state() -> str:
    """The sandbox of this process's plugins in one sentence, in the operator's language (the admin's
    Plugins page; the problem a refusal names is the probe's, as written)."""
    if not enabled():
        return gettext(
            "OFF (MAIBOT_PLUGIN_SANDBOX=off): plugins run as the server's user and can read the data dir, the "
            "database and the server's secrets"
        )
    if problem := support().problem:
        return gettext(REFUSAL) % {"problem": problem}
    if as_root():
        who = gettext("each plugin as a uid of its own")
    else:
        who = gettext("as the server's user in a user namespace")
    if support().network:
        network = gettext("slirp4netns for isolated networks")
    else:
        network = gettext("no slirp4netns: no plugin network")
    return gettext("bubblewrap (%(who)s; %(network)s)") % {"who": who, "network": network}


def effective_network(network: str) -> str:
    """The network a runner really gets: "isolated" without slirp4netns is "none"."""
    if network == "isolated" and not support().network:
        return "none"
    return network


NOT_SANDBOXED = gettext_noop(
    "NOT SANDBOXED (MAIBOT_PLUGIN_SANDBOX=off): it runs as the server's user and can read the data dir, the "
    "database and the server's secrets, and use this machine's network"
)
NETWORKS = {
    "none": gettext_noop("no network"),
    "isolated": gettext_noop("the internet only (slirp4netns; not this machine's loopback)"),
    "host": gettext_noop("this machine's network, loopback included (MAIBOT_PLUGIN_HOST_NETWORK)"),
}


def _as_written(text: str) -> str:
    return text


def describe(plugin_id: str, network: str, translate: Callable[[str], str] = _as_written) -> str:
    """How a plugin's runner is contained: as its record keeps it, or with translate=gettext in the
    operator's language (the admin's Plugins page)."""
    if not enabled():
        return translate(NOT_SANDBOXED)
    in_namespace = gettext_noop("the server's user in a user namespace")
    who = f"uid {plugin_uid(plugin_id)}" if as_root() else translate(in_namespace)
    net = translate(NETWORKS[effective_network(network)])
    text = translate(gettext_noop("bubblewrap, %(who)s, %(network)s")) % {"who": who, "network": net}
    if network != effective_network(network):
        text = translate(
            gettext_noop("%(sandbox)s; no network because slirp4netns is not installed (apt-get install slirp4netns)")
        ) % {"sandbox": text}
    return text


def python_paths() -> list[Path]:
    """What a Python started like this one needs to see: its installation, the virtualenv, sys.path."""
    paths = [PROJECT_ROOT, Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.executable).parent]
    paths += [Path(p) for p in sys.path if p and os.path.isdir(p)]
    return paths


def hidden_paths() -> list[str]:
    """What the view must not show although a bound directory may contain it: the data dir, and the
    files of an SQLite database kept elsewhere (their directory when it holds nothing the view needs)."""
    from django.conf import settings

    paths = [str(settings.DATA_DIR), str(settings.MEDIA_ROOT)]
    for database in settings.DATABASES.values():
        if "sqlite3" not in str(database.get("ENGINE")):
            continue
        for name in (database.get("NAME"), (database.get("TEST") or {}).get("NAME")):
            if name and str(name) != ":memory:" and not str(name).startswith("file:"):
                db_file = os.path.abspath(str(name))
                paths += [os.path.dirname(db_file), *(db_file + s for s in ("", "-wal", "-shm", "-journal"))]
    return list(dict.fromkeys(paths))


def unreadable(folder: Path) -> list[str]:
    """Files and directories of a plugin's folder its runner could not read as its own uid (the server
    runs as root and they are not readable by others): the plugin cannot load from them. Its config.toml
    is not among them: the host reads it and sends its text (it may be the host's own 0600 file)."""
    if not as_root() or not enabled():
        return []
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in ("", *files):
            if name == "config.toml" and root == str(folder):
                continue
            path = os.path.join(root, name) if name else root
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue
            need = 0o005 if not name else 0o004
            if mode & need != need:
                found.append(os.path.relpath(path, folder) if name else (os.path.relpath(path, folder) + "/"))
                if len(found) >= 5:
                    return found
    return found


@dataclass
class Jail:
    """One sandboxed process tree: bwrap's command line, the fds it must inherit, and (network
    "isolated") the slirp4netns connecting its network namespace once it runs."""

    argv: list[str]
    network: str
    home: str
    pass_fds: tuple[int, ...] = ()
    info_fd: int | None = None  # bwrap writes the sandbox's pid here (isolated network)
    _slirp: asyncio.subprocess.Process | None = None
    _slirp_exit: int | None = None
    _child_fds: list[int] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        *,
        command: list[str],
        uid: int,
        network: str,
        tmp_mb: int,
        visible: list[Path],
        own_ro: list[Path] = (),
        own_rw: list[Path] = (),
        own_rw_at: list[tuple[Path, Path]] = (),
        chdir: Path | None = None,
    ) -> Jail:
        """The bwrap command for `command` (plugins.bwrap), seeing `visible` (read-only) and the system, with
        the data dir hidden, `own_ro` read-only and `own_rw` writable on top, as `uid` (server root) and
        with `network`."""
        network = effective_network(network)
        bw = bwrap.build(
            command=command,
            uid=uid,
            network=network,
            tmp_mb=tmp_mb,
            visible=visible,
            hidden=hidden_paths(),
            root=as_root(),
            own_ro=own_ro,
            own_rw=own_rw,
            own_rw_at=own_rw_at,
            chdir=chdir,
        )
        jail = cls(argv=bw.args, network=network, home=bw.home, pass_fds=tuple(bw.fds), info_fd=bw.info_fd)
        jail._child_fds = bw.fds
        return jail

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """The environment of the sandboxed process: `base` with its own home and temp dir."""
        env = {k: v for k, v in base.items() if k not in ("USER", "LOGNAME", "HOME", "TMPDIR")}
        env.update(HOME=self.home, TMPDIR="/tmp")
        return env

    def spawned(self) -> None:
        """Close this process's copies of the fds the sandbox inherited (call once bwrap started)."""
        for fd in self._child_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._child_fds = []

    async def connect_network(self) -> None:
        """For network "isolated": start slirp4netns on the sandbox's network namespace and wait until
        it is configured. Call once the sandboxed process runs (bwrap has set up its loopback by then)
        and before untrusted code needs the network. Raises RuntimeError with the reason."""
        if self.network != "isolated" or self.info_fd is None:
            return
        loop = asyncio.get_running_loop()
        info = await asyncio.wait_for(loop.run_in_executor(None, _read_json, self.info_fd), SLIRP_READY_TIMEOUT)
        os.close(self.info_fd)
        self.info_fd = None
        pid = int(info["child-pid"])
        ready_read, ready_write = os.pipe()
        exit_read, exit_write = os.pipe()
        passed = [ready_write, exit_read]
        argv = [
            _program("slirp4netns") or "slirp4netns",
            "--configure",
            "--mtu=65520",
            "--disable-host-loopback",
            "--enable-seccomp",
            f"--ready-fd={ready_write}",
            f"--exit-fd={exit_read}",
        ]
        if as_root():
            argv.append("--enable-sandbox")  # its own mount namespace, capabilities dropped
        else:
            # The network namespace belongs to bwrap's outer user namespace (the sandbox itself runs in a
            # nested one): slirp4netns joins that owner to enter it. Its --enable-sandbox needs root.
            with open(f"/proc/{pid}/ns/net", "rb") as netns:
                owner = fcntl.ioctl(netns.fileno(), NS_GET_USERNS)
            passed.append(owner)
            argv.append(f"--userns-path=/proc/self/fd/{owner}")
        argv += [str(pid), "tap0"]
        try:
            self._slirp = await asyncio.create_subprocess_exec(
                *argv,
                pass_fds=passed,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            for fd in passed:
                os.close(fd)
        self._slirp_exit = exit_write
        try:
            ready = await asyncio.wait_for(loop.run_in_executor(None, os.read, ready_read, 1), SLIRP_READY_TIMEOUT)
        except TimeoutError:
            ready = b""
        finally:
            os.close(ready_read)
        if ready != b"1":
            code = self._slirp.returncode
            await self.close()
            raise RuntimeError(f"slirp4netns could not connect the plugin's network (exit code {code})")

    async def close(self) -> None:
        """End slirp4netns (if any) and release the fds."""
        self.spawned()
        if self.info_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.info_fd)
            self.info_fd = None
        if self._slirp_exit is not None:
            with contextlib.suppress(OSError):
                os.close(self._slirp_exit)  # slirp4netns exits when this closes
            self._slirp_exit = None
        if self._slirp is not None and self._slirp.returncode is None:
            try:
                await asyncio.wait_for(self._slirp.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self._slirp.kill()
                await self._slirp.wait()


def _read_json(fd: int) -> dict:
    """bwrap's --info-fd document (it writes it once, right after creating the namespaces)."""
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        with contextlib.suppress(ValueError):
            return json.loads(data)
    return json.loads(data or b"{}")


def runner_jail(
    *, plugin_id: str, command: list[str], folder: Path, data_dir: Path, runtime_dir: Path, network: str, tmp_mb: int
) -> Jail:
    """The sandbox of a plugin's runner: its folder read-only, its data and runtime dirs writable. Its data
    dir is also the `data/` beside the plugin folders, where MaiBot's plugins keep state (the NapCat adapter
    plugin: `<plugins>/data/napcat_adapter/ban_state.json`): its own there, not another plugin's."""
    return Jail.build(
        command=command,
        uid=plugin_uid(plugin_id),
        network=network,
        tmp_mb=tmp_mb,
        visible=python_paths(),
        own_ro=[folder],
        own_rw=[data_dir, runtime_dir],
        own_rw_at=[(data_dir, folder.parent / "data")],
        chdir=runtime_dir,
    )


def browser_jail(*, command: list[str], network: str) -> Jail:
    """The sandbox of a render's browser: nothing of the plugin's, its own uid, `network`."""
    return Jail.build(command=command, uid=RENDER_UID, network=network, tmp_mb=512, visible=python_paths())


def prepare_dirs(plugin_id: str, *dirs: Path) -> None:
    """Create a plugin's writable dirs; when the server runs as root, owned by the plugin's uid (files a
    previous uid left are handed over) inside parents only root may enter."""
    uid = plugin_uid(plugin_id)
    for path in dirs:
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        if not as_root() or not enabled():
            continue
        if path.stat().st_uid != uid:
            for root, names, files in os.walk(path):
                for name in (*names, *files):
                    with contextlib.suppress(OSError):
                        os.lchown(os.path.join(root, name), uid, uid)
            os.chown(path, uid, uid)
        os.chmod(path, 0o700)
