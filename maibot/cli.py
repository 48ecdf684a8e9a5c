"""The `maibot` command (and `python3 maibot.pyz`): start everything, run a management command, or say the version.

    maibot                     migrate the data dir, then serve (ASGI server + cluster, supervised)
    maibot manage <command>    any management command (createsuperuser, create_api_token, qcluster, serve…)
    maibot --version

The data dir is `MAIBOT_DATA_DIR`, else `./maibot-data` in the current folder; every other setting comes
from the environment as with manage.py (docs/configuration.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from core import __version__

DEFAULT_DATA_DIR = "maibot-data"
USAGE = __doc__.split("\n\n")[1]


def _prepare_environment() -> None:
    # Absolute, so the children (which run in the package's folder) use the same folder.
    data_dir = os.environ.get("MAIBOT_DATA_DIR") or DEFAULT_DATA_DIR
    os.environ["MAIBOT_DATA_DIR"] = str(Path(data_dir).expanduser().resolve())
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")


def interpreter_problem() -> str | None:
    """Why this Python cannot run this build, or None. maibot.pyz holds the compiled dependencies of the
    CPython it was built with; under another minor version they fail to import with an obscure error."""
    try:
        # Two of them (each compiled for one CPython minor version), imported before anything else fails.
        import _cffi_backend  # noqa: F401
        import pydantic_core._pydantic_core  # noqa: F401
    except ImportError as exc:
        return (
            f"this build's compiled dependencies do not load on Python {sys.version.split()[0]} ({exc}). "
            "Run it with the Python it was built with, or build it with yours (make dist DIST_PYTHON=...)."
        )
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["--version"], ["-V"]):
        print(f"maibot {__version__}")
        return 0
    if args[:1] in (["--help"], ["-h"], ["help"]):
        print(f"maibot {__version__}\n{USAGE}")
        return 0
    if args and args[0] != "manage":
        print(f"maibot: unknown arguments {' '.join(args)!r}\n{USAGE}", file=sys.stderr)
        return 2
    if problem := interpreter_problem():
        print(f"maibot: {problem}", file=sys.stderr)
        return 3
    _prepare_environment()
    from django.core.management import execute_from_command_line

    if args:
        execute_from_command_line(["maibot manage", *args[1:]])
        return 0
    execute_from_command_line(["maibot", "bootstrap", "--setup-page"])
    sys.stdout.flush()  # the set-up code must reach a log file (systemd, nohup) before serving starts
    execute_from_command_line(["maibot", "serve"])
    return 0
