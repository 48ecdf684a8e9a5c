"""The single file (dist/maibot.pyz, made by shiv): its first start, and the build step that puts it in.

shiv's own start-up unpacks the packages into SHIV_ROOT (default ~/.shiv/<file>_<build id>) silently, and
leaves bytecode to the first imports, which write none under PYTHONDONTWRITEBYTECODE=1 (common in
Dockerfiles): then every process of every start compiles every module again. `make dist` therefore
replaces the archive's `__main__` (`finish`): it first calls `unpack()` from this module, copied to the
archive's root as `_maibot_first_start`, then shiv's bootstrap as before. When this build has no
extraction yet, `unpack()` makes it — the same folder, lock and atomic rename as shiv's, so shiv finds it
and goes on — printing progress lines, and compiles every module into it once (py_compile writes
whatever PYTHONDONTWRITEBYTECODE says; later starts only read). An extraction that exists is reused as is.

It runs before any package is on sys.path: the standard library and shiv's `_bootstrap` only.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT_MODULE = "_maibot_first_start"
MAIN = f"import {ROOT_MODULE}\n{ROOT_MODULE}.unpack()\nimport _bootstrap\n_bootstrap.bootstrap()\n"
PROGRESS_STEPS = 4  # a line at each quarter


def _say(text: str) -> None:
    print(f"maibot: {text}", file=sys.stderr, flush=True)


def _progress(done: int, total: int, last: int, what: str) -> int:
    """Say `what` is at the next quarter when `done` reached it; returns the last quarter said."""
    quarter = done * PROGRESS_STEPS // max(total, 1)
    if quarter > last:
        _say(f"  {what} {quarter * 100 // PROGRESS_STEPS} % ({done:,} of {total:,})")
    return quarter


def unpack() -> None:
    """Unpack this build's packages and compile them, once (see the module); nothing when already done."""
    from _bootstrap import cache_path, current_zipfile
    from _bootstrap.environment import Environment
    from _bootstrap.filelock import FileLock

    with current_zipfile() as archive:
        if archive is None:
            return
        env = Environment.from_json(archive.read("environment.json").decode())
        target = cache_path(archive, env.root, env.build_id)
        if (target / "site-packages").exists() or env.force_extract:
            return  # reused as is (or shiv's forced extraction, left to shiv)
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(target.parent / f".{target.name}_lock"):
            if not (target / "site-packages").exists():  # another start may have made it meanwhile
                _extract_and_compile(archive, target)


def _extract_and_compile(archive: zipfile.ZipFile, target: Path) -> None:
    began = time.monotonic()
    tmp = target.parent / f"{target.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # left by a start that was interrupted
    members = [info for info in archive.infolist() if info.filename.startswith("site-packages")]
    _say(f"first start of this build: unpacking {len(members):,} files into {target} (once)")
    last = 0
    for done, info in enumerate(members, 1):
        os.chmod(archive.extract(info, tmp), info.external_attr >> 16)  # its permissions, as shiv does
        last = _progress(done, len(members), last, "unpacked")
    sources = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*.py"))
    _say(f"compiling {len(sources):,} modules (once: later starts only read them)")
    chunks = [sources[i : i + 200] for i in range(0, len(sources), 200)]
    done = last = 0
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for compiled in pool.map(_compile, [(str(tmp), str(target), chunk) for chunk in chunks]):
            done += compiled
            last = _progress(done, len(sources), last, "compiled")
    tmp.rename(target)
    _say(f"unpacked and compiled in {time.monotonic() - began:.1f} s")


def _compile(job: tuple[str, str, list[str]]) -> int:
    """Compile one chunk of sources under `tmp`, naming them as they will be found under `final`."""
    import py_compile

    tmp, final, names = job
    for name in names:
        try:
            py_compile.compile(os.path.join(tmp, name), dfile=os.path.join(final, name), doraise=True)
        except (py_compile.PyCompileError, OSError, ValueError):
            pass  # a file that is no Python 3 module (a template, a test fixture): imported never
    return len(names)


def finish(pyz: Path) -> None:
    """The build step: put this module at the archive's root and the `__main__` that calls it first."""
    data = pyz.read_bytes()
    shebang = data[: data.index(b"\n") + 1] if data.startswith(b"#!") else b""
    tmp = pyz.with_name(pyz.name + ".tmp")
    with zipfile.ZipFile(pyz) as src, tmp.open("wb") as fh:
        fh.write(shebang)
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename not in ("__main__.py", f"{ROOT_MODULE}.py"):
                    dst.writestr(info, src.read(info))
            dst.writestr(f"{ROOT_MODULE}.py", Path(__file__).read_text(encoding="utf-8"))
            dst.writestr("__main__.py", MAIN)
    tmp.chmod(pyz.stat().st_mode)
    tmp.replace(pyz)


if __name__ == "__main__":
    finish(Path(sys.argv[1]))
