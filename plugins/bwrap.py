"""The bubblewrap (`bwrap`) command line of one sandboxed process, as plugins.sandbox describes the view:
its namespaces, the system read-only, a few files of /etc, its own /etc/passwd, /etc/group and
resolv.conf, the visible paths read-only with the hidden ones covered, its own folders on top, and (a
server running as root) setpriv dropping to its uid. Building it starts nothing; the pipes it opens for
bwrap's data files and --info-fd are the caller's to pass and close (`BwrapCommand.fds`)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

SLIRP_DNS = "10.0.2.3"
HOSTNAME = "maibot-plugin"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc a Python program, an HTTP client and Chromium read; never the rest (shadow, ssh keys, the
# machine's other configuration).
ETC_ENTRIES = (
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/pki/tls/certs",
    "/etc/pki/ca-trust",
    "/etc/crypto-policies",
    "/etc/mime.types",
    "/etc/fonts",
    "/etc/alternatives",
    "/etc/chromium",
    "/etc/chromium.d",
)


def program(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")


def under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


@dataclass
class BwrapCommand:
    """bwrap's argv before the command, what it mounts where ("bind" or "tmpfs"), and the fds it inherits."""

    args: list[str]
    mounts: list[tuple[str, str]] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    info_fd: int | None = None  # bwrap writes the sandbox's pid here (isolated network)
    home: str = "/tmp"

    def data(self, text: str) -> str:
        """A pipe holding `text`, for --ro-bind-data: its read end's number."""
        read, write = os.pipe()
        os.write(write, text.encode("utf-8"))
        os.close(write)
        self.fds.append(read)
        return str(read)

    def covering(self, path: str) -> tuple[str, str] | None:
        inside = [m for m in self.mounts if under(path, m[0])]
        return max(inside, key=lambda m: len(m[0])) if inside else None

    def parents(self, path: str) -> None:
        # bwrap would create missing parents as 0700 root: unreachable for the sandbox's uid.
        parts = Path(path).parts[1:-1]
        for i in range(len(parts)):
            parent = "/" + "/".join(parts[: i + 1])
            mount = self.covering(parent)
            if mount is not None and (mount[1] == "bind" or mount[0] == parent):
                continue
            self.args.extend(["--perms", "0755", "--dir", parent])
            self.mounts.append((parent, "tmpfs"))

    def bind(self, path: str, *, writable: bool = False, source: str | None = None) -> None:
        self.parents(path)
        self.args.extend(["--bind" if writable else "--ro-bind", source or path, path])
        self.mounts.append((path, "bind"))


def build(
    *,
    command: list[str],
    uid: int,
    network: str,
    tmp_mb: int,
    visible: list[Path],
    hidden: list[str],
    root: bool,
    own_ro: list[Path] = (),
    own_rw: list[Path] = (),
    own_rw_at: list[tuple[Path, Path]] = (),
    chdir: Path | None = None,
) -> BwrapCommand:
    """The bwrap command for `command`, seeing `visible` (read-only) and the system, with `hidden` (the
    data dir…) covered, `own_ro` read-only and `own_rw` writable on top (and each (source, place) of
    `own_rw_at`: source writable at place), as `uid` when the server runs as `root` (else as the
    server's user in a user namespace), with `network` ("none", "isolated" or "host": the effective one)."""
    bw = _namespaces(network, root)
    _scratch(bw, tmp_mb)
    _system(bw)
    bw.home = str(chdir) if chdir else "/tmp"
    gid = _identity(bw, network, uid, root)
    needed = _visible(bw, visible)
    _hide(bw, hidden, needed, [*own_ro, *own_rw, *(place for _, place in own_rw_at)], root)
    for path in own_ro:
        bw.bind(str(path))
    for path in own_rw:
        bw.bind(str(path), writable=True)
    for source, place in own_rw_at:
        mount = bw.covering(str(place))
        if mount is not None and mount[1] == "bind" and not os.path.isdir(place):
            continue  # inside a read-only view where bwrap could make no mount point: left out
        bw.bind(str(place), writable=True, source=str(source))
    if chdir is not None:
        bw.args += ["--chdir", str(chdir)]
    if root:
        _drop_privileges(bw, uid, gid)
    bw.args += command
    return bw


def _namespaces(network: str, root: bool) -> BwrapCommand:
    """bwrap itself and the namespaces it makes (and its --info-fd, for slirp4netns to find it)."""
    args = [
        program("bwrap") or "bwrap",
        "--new-session",
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        HOSTNAME,
    ]
    if not root:
        args += ["--unshare-user", "--disable-userns"]
    if network != "host":
        args.append("--unshare-net")
    bw = BwrapCommand(args)
    if network == "isolated":
        bw.info_fd, info_write = os.pipe()
        bw.fds.append(info_write)
        bw.args += ["--info-fd", str(info_write)]
    return bw


def _scratch(bw: BwrapCommand, tmp_mb: int) -> None:
    """Its own /proc and minimal /dev, and a private, bounded /tmp and /dev/shm."""
    tmp_bytes = str(max(1, tmp_mb) * 1024 * 1024)
    bw.args += ["--proc", "/proc", "--dev", "/dev"]
    bw.args += ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/tmp"]
    bw.args += ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/dev/shm"]
    bw.mounts += [("/tmp", "tmpfs"), ("/dev", "tmpfs"), ("/proc", "bind")]


def _system(bw: BwrapCommand) -> None:
    """/usr and the /bin, /lib… beside it read-only; an empty /etc with ETC_ENTRIES in it."""
    for name in SYSTEM_DIRS:
        if os.path.islink(name):
            bw.args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            bw.bind(name)
    bw.args += ["--perms", "0755", "--dir", "/etc"]
    bw.mounts.append(("/etc", "tmpfs"))
    for entry in ETC_ENTRIES:
        if os.path.exists(entry):
            bw.parents(entry)
            bw.args += ["--ro-bind", os.path.realpath(entry), entry]
            bw.mounts.append((entry, "bind"))


def _identity(bw: BwrapCommand, network: str, uid: int, root: bool) -> int:
    """Its resolv.conf (slirp's DNS when isolated), and an /etc/passwd and /etc/group naming only its
    own user; the gid it runs as."""
    resolv = f"nameserver {SLIRP_DNS}\n" if network == "isolated" else read_text("/etc/resolv.conf")
    bw.args += ["--perms", "0644", "--ro-bind-data", bw.data(resolv), "/etc/resolv.conf"]
    gid = uid if root else os.getgid()
    shown_uid = uid if root else os.getuid()
    passwd = f"plugin:x:{shown_uid}:{gid}::{bw.home}:/usr/sbin/nologin\n"
    bw.args += ["--perms", "0644", "--ro-bind-data", bw.data(passwd), "/etc/passwd"]
    bw.args += ["--perms", "0644", "--ro-bind-data", bw.data(f"plugin:x:{gid}:\n"), "/etc/group"]
    return gid


def _visible(bw: BwrapCommand, visible: list[Path]) -> list[str]:
    """Bind `visible` (and the deployment's TLS roots) read-only, outermost first, skipping what the
    system or an outer path shows already; the directories the view needs (kept when hiding)."""
    for extra in (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")):
        if extra and os.path.exists(extra):
            visible = [*visible, Path(extra)]  # the deployment's TLS roots (passed in the environment)
    system = [m[0] for m in bw.mounts if m[1] == "bind"]
    wanted = sorted({os.path.realpath(p) for p in visible} | {os.path.abspath(p) for p in visible}, key=len)
    for path in wanted:
        if path == "/" or not os.path.exists(path) or any(under(path, s) for s in system):
            continue
        if any(under(path, m[0]) for m in bw.mounts if m[1] == "bind" and m[0] not in system):
            continue  # inside a directory bound already
        if os.path.islink(path):
            continue  # a symlink inside a bound tree resolves there; its target is bound by its realpath
        bw.bind(path)
    return [p for p in wanted if p != "/" and os.path.isdir(p) and not os.path.islink(p)]


def _hide(bw: BwrapCommand, hidden: list[str], needed: list[str], own: list[Path], root: bool) -> None:
    """Cover what must not be seen (a directory by an empty tmpfs, a file by /dev/null), and the
    folders on the way to its own that its uid could not pass; what the view needs within stays."""
    # Outermost first: a folder covered later would hide what was mounted inside it before.
    for secret in sorted({*hidden, *_opaque_parents(own, bw.mounts, root)}, key=len):
        mount = bw.covering(secret)
        if mount is None or mount[1] != "bind" or not os.path.exists(secret):
            continue  # not in the view anyway (or hidden already)
        if os.path.isdir(secret) and secret not in needed:
            bw.args += ["--tmpfs", secret]
            bw.mounts.append((secret, "tmpfs"))
            for inside in [n for n in needed if under(n, secret)]:
                bw.bind(inside)  # what the view needs within it (Python, the project) stays
        elif os.path.isfile(secret):
            bw.args += ["--ro-bind", "/dev/null", secret]


def _opaque_parents(paths: list[Path], mounts: list[tuple[str, str]], root: bool) -> list[str]:
    """Folders in the view on the way to `paths` that the runner's uid could not pass through (a root
    server's 0700 folder inside a visible tree, e.g. a private folder holding the data dir): they are
    covered like the data dir, so the runner's own folders mounted inside them can be reached. Nothing in
    them was visible to that uid anyway."""
    if not root:
        return []  # the runner is the server's own uid: it passes wherever the server does
    bound = [m[0] for m in mounts if m[1] == "bind"]
    found = []
    for path in paths:
        parts = Path(os.path.abspath(path)).parts[1:-1]
        for i in range(len(parts)):
            parent = "/" + "/".join(parts[: i + 1])
            if not any(under(parent, b) and parent != b for b in bound):
                continue
            try:
                mode = os.stat(parent).st_mode
            except OSError:
                continue
            if not mode & 0o001:
                found.append(parent)
    return found


def _drop_privileges(bw: BwrapCommand, uid: int, gid: int) -> None:
    """A root server: setpriv drops to `uid` with no capabilities, no groups and no_new_privs."""
    bw.args += [
        program("setpriv") or "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]
    # bwrap keeps these two capabilities for setpriv alone (setpriv drops them with the uid).
    bw.args[1:1] = ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]


def read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")[:65536]
    except OSError:
        return ""
