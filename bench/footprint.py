"""Benchmark: what the embedded default costs at rest, and how quickly it starts.

Starts the embedded default the way an operator does — `make run` (in `--tree`, default this checkout: a
baseline is measured by pointing it at another worktree) and the single file (`python3 dist/maibot.pyz`,
build it first with `make dist`; `--pyz` another build) —
on a fresh data dir and then again on the same (existing) one, and prints for each start:
  1. start-up: from the command to the first `GET /healthz` answering 200 (the first start includes
     migrating a new data dir, and for the single file unpacking it into a fresh SHIV_ROOT);
  2. per process, `--settle` seconds after start: PSS and RSS (/proc/<pid>/smaps_rollup), with PSS split
     into anonymous and file-backed memory, and the total over all processes (PSS adds up; RSS does not);
  3. at idle, over `--idle` seconds: each process's CPU time (utime + stime, all its threads) and its
     voluntary context switches per second (each is a wake-up: a process that polls shows them even when
     its CPU time rounds to zero).
Each case runs with PYTHONDONTWRITEBYTECODE unset and set to 1 (`--bytecode` picks one).

    .venv/bin/python bench/footprint.py [--how run,pyz] [--starts 3] [--settle 30] [--idle 30]
    .venv/bin/python bench/footprint.py --how run --starts 1 --settle 3 --idle 3   # a quick try
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# `make` and the shell of its recipe wait for maibot to end: not part of what is measured.
LAUNCHERS = {"make", "sh", "bash"}


@dataclass
class Snapshot:
    """One process at one instant."""

    pid: int
    ppid: int
    name: str
    pss_kb: int = 0
    pss_anon_kb: int = 0
    pss_file_kb: int = 0
    uss_kb: int = 0  # its own pages (private clean + dirty): what ending the process gives back
    rss_kb: int = 0
    cpu_ticks: int = 0
    switches: dict[int, int] = field(default_factory=dict)  # voluntary context switches per thread
    threads: dict[int, str] = field(default_factory=dict)  # each thread's name (/proc/<pid>/task/<tid>/comm)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def descendants(root: int) -> list[int]:
    """`root` and every live process whose ancestry leads to it, in start order (pid order)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = _parent(int(entry.name))
            except (OSError, ValueError):
                continue
    found, frontier = {root}, {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return sorted(found)


def _measured(snap: Snapshot) -> bool:
    return snap.name.split(" ", 1)[0] not in LAUNCHERS


def _name(pid: int) -> str:
    """A short name: the command line without the interpreter and the repository's path."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    argv = [a for a in argv if a]
    if argv and "python" in Path(argv[0]).name:
        argv = argv[1:]
    if argv[:1] == ["-m"]:
        argv = argv[1:]
    words = [Path(a).name if a.startswith("/") else a for a in argv]
    return " ".join(w for w in words if not w.startswith("-") and not w.isdigit())[:60]


def snapshot(pid: int) -> Snapshot | None:
    """Memory, CPU time and wake-ups of one process (None: it has gone)."""
    try:
        snap = Snapshot(pid=pid, ppid=_parent(pid), name=_name(pid))
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, value = line.partition(":")
            field = {"Pss": "pss_kb", "Pss_Anon": "pss_anon_kb", "Pss_File": "pss_file_kb", "Rss": "rss_kb"}.get(key)
            if field:
                setattr(snap, field, int(value.split()[0]))
            elif key in ("Private_Clean", "Private_Dirty"):
                snap.uss_kb += int(value.split()[0])
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        snap.cpu_ticks = int(fields[11]) + int(fields[12])  # utime + stime, every thread's
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    snap.switches[int(task.name)] = int(line.split()[1])
                elif line.startswith("Name:"):
                    snap.threads[int(task.name)] = line.split(":", 1)[1].strip()
    except (OSError, ValueError, StopIteration):
        return None
    return snap


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


@dataclass
class Start:
    """One start of the embedded default: its command, its environment, its log."""

    how: str  # "run" (make run's path) or "pyz"
    data_dir: Path
    env: dict
    log: Path
    pyz_folder: Path | None = None

    tree: Path = ROOT

    def launch(self) -> subprocess.Popen:
        out = self.log.open("ab")
        if self.how == "run":
            # `make run` itself in `tree` (its recipe is what is measured, whatever it is in that tree), in a
            # session of its own: stopping it is a SIGTERM to that whole group, as a Ctrl-C would be. Never
            # its environment step (-o): a benchmark installs nothing.
            return subprocess.Popen(
                ["make", "-s", "-o", ".venv/.runtime", "run"],
                cwd=self.tree,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # The operator's python3: the one on PATH, not this virtual environment's.
        venv_bin = str(Path(sys.prefix) / "bin")
        path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
        python = shutil.which("python3", path=path) or "python3"
        return subprocess.Popen(
            [python, "maibot.pyz"],
            cwd=self.pyz_folder,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def measure_start(start: Start, *, settle: float, idle: float, port: int) -> dict:
    """Start, time /healthz, wait `settle`, snapshot memory, count CPU and wake-ups over `idle`, stop."""
    began = time.monotonic()
    proc = start.launch()
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        while not _healthy(url):
            if proc.poll() is not None:
                raise SystemExit(f"{start.how} exited ({proc.returncode}):\n{start.log.read_text()[-3000:]}")
            if time.monotonic() - began > 300:
                raise SystemExit(f"{start.how}: no /healthz 200 in 300 s:\n{start.log.read_text()[-3000:]}")
            time.sleep(0.05)
        up = time.monotonic() - began
        result = {"startup": up}
        if settle or idle:
            time.sleep(max(0.0, settle - (time.monotonic() - began)))
            before = {s.pid: s for s in map(snapshot, descendants(proc.pid)) if s and _measured(s)}
            time.sleep(idle)
            after = {s.pid: s for s in map(snapshot, descendants(proc.pid)) if s and _measured(s)}
            result["processes"] = [(before[pid], after[pid]) for pid in before if pid in after]
        return result
    finally:
        started = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # `make` ends at once; the supervisor stops its children (own sessions) in its own time: the next
        # start must find nothing of this one (its port free, its processes gone).
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in started) and time.monotonic() < deadline:
            time.sleep(0.1)


def print_processes(pairs: list[tuple[Snapshot, Snapshot]], idle: float, *, threads: bool = False) -> None:
    head = ("pid", "ppid", "PSS", "anon", "file", "own", "RSS")
    print(
        "    "
        + " ".join(f"{h:>7}" for h in head)
        + f"  {'CPU %':>6} {'CPU s':>6} {'wake/s':>7} {'wake/min':>8}  process (MiB)"
    )
    totals = [0, 0, 0, 0, 0, 0.0, 0.0, 0.0]
    for before, after in pairs:
        cpu_s = (after.cpu_ticks - before.cpu_ticks) / CLOCK_TICKS
        cpu = cpu_s / idle * 100
        # Per thread: a thread that ended meanwhile takes its count with it; one that began counts whole.
        per_thread = {tid: n - before.switches.get(tid, 0) for tid, n in after.switches.items()}
        wakes = sum(per_thread.values()) / idle
        kib = (after.pss_kb, after.pss_anon_kb, after.pss_file_kb, after.uss_kb, after.rss_kb)
        mib = [v / 1024 for v in kib]
        totals = [t + v for t, v in zip(totals, [*mib, cpu, cpu_s, wakes * 60], strict=True)]
        columns = " ".join(f"{v:>7.1f}" for v in mib)
        print(
            f"    {after.pid:>7} {after.ppid:>7}  {columns}  {cpu:>6.2f} {cpu_s:>6.2f} {wakes:>7.1f} {wakes * 60:>8.0f}"
            f"  {after.name}"
        )
        if threads:
            for tid, n in sorted(per_thread.items(), key=lambda item: -item[1]):
                if n:
                    print(f"{'':>60}thread {tid} {after.threads.get(tid, '')!r}: {n / idle * 60:.0f} wake-ups/min")
    print(
        f"    {len(pairs)} processes: PSS {totals[0]:.1f} MiB (anon {totals[1]:.1f}, file {totals[2]:.1f}; own pages "
        f"{totals[3]:.1f}), RSS {totals[4]:.1f} MiB (shared pages counted in each), CPU {totals[5]:.2f} % of a core "
        f"({totals[6]:.2f} s over {idle:g} s), {totals[7]:.0f} wake-ups/min"
    )


def run_case(
    how: str, *, bytecode: str, starts: int, settle: float, idle: float, pyz: Path, tree: Path, threads: bool = False
) -> None:
    """A fresh data dir (and SHIV_ROOT), then `starts - 1` more starts on the same one."""
    work = Path(tempfile.mkdtemp(prefix=f"maibot-bench-footprint-{how}-"))
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", str(work)),
        "LANG": "C.UTF-8",
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "LOG_LEVEL": "WARNING",
    }
    if bytecode == "off":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    pyz_folder = None
    if how == "run":
        env["MAIBOT_DATA_DIR"] = str(work / "data")
    else:
        pyz_folder = work / "folder"
        pyz_folder.mkdir()
        shutil.copy(pyz, pyz_folder / "maibot.pyz")
        env["SHIV_ROOT"] = str(work / "shiv")  # maibot-data goes in the folder, as for an operator
    label = f"{how} ({'PYTHONDONTWRITEBYTECODE=1' if bytecode == 'off' else 'bytecode written'})"
    try:
        for i in range(starts):
            kind = "fresh data dir" if i == 0 else "existing data dir"
            start = Start(how, work / "data", env, work / "start.log", pyz_folder, tree)
            # Memory and idle CPU on the first start and the last (the steady state); the others start only.
            full = i in (0, starts - 1)
            result = measure_start(start, settle=settle if full else 0, idle=idle if full else 0, port=port)
            print(f"  {label}, start {i + 1} ({kind}): /healthz 200 after {result['startup']:.2f} s")
            if "processes" in result:
                print(f"    memory {settle:g} s after start, CPU and wake-ups over the next {idle:g} s:")
                print_processes(result["processes"], idle, threads=threads)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--how", default="run,pyz", help="run (make run's path), pyz (the single file), or both")
    parser.add_argument("--bytecode", choices=["on", "off", "both"], default="both")
    parser.add_argument("--starts", type=int, default=3, help="starts per case: one fresh, the rest existing")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds after start before memory is read")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds over which idle CPU is counted")
    parser.add_argument("--pyz", type=Path, default=ROOT / "dist" / "maibot.pyz")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose `make run` is measured")
    parser.add_argument("--threads", action="store_true", help="also each thread's wake-ups per minute at idle")
    args = parser.parse_args()
    hows = [h.strip() for h in args.how.split(",") if h.strip()]
    if "pyz" in hows and not args.pyz.exists():
        raise SystemExit(f"{args.pyz} not found: build it with `make dist`")
    load = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load {load:.2f}")
    for how in hows:
        for bytecode in ["on", "off"] if args.bytecode == "both" else [args.bytecode]:
            run_case(
                how,
                bytecode=bytecode,
                starts=args.starts,
                settle=args.settle,
                idle=args.idle,
                pyz=args.pyz,
                tree=args.tree.resolve(),
                threads=args.threads,
            )


if __name__ == "__main__":
    main()
