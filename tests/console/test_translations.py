"""The console's catalogs (console/locale: Simplified Chinese and English) are complete and current: every
string the code and the templates mark for translation is in both, translated and not fuzzy; none is
left that the code no longer has; and the compiled .mo files say what the .po files say. Django's
makemessages extracts the strings (GNU gettext's xgettext underneath; .ci/run installs gettext) into a
copy of the catalogs, never into the repository's."""

from __future__ import annotations

import fcntl
import gettext
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from tests.conftest import ROOT

pytestmark = pytest.mark.static  # never the database: the PostgreSQL suite leaves it out

LOCALE_DIR = ROOT / "console" / "locale"
LOCALES = ("zh_Hans", "en")
# What makemessages must not read: the tests, benchmarks, docs, the catalogs themselves, data dirs, builds.
# (Not "config": a pattern matches a folder's name anywhere, and core/config's help texts are translated.)
IGNORED = ["tests", "bench", "docs", "locale", "data", "dist", "build", "site", "maibot-data"]


def tool(name: str) -> str:
    """A GNU gettext program; missing, the test fails (translations are never silently unchecked)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: install GNU gettext (apt-get install -y gettext)")
    return path


def po_path(root: Path, locale: str) -> Path:
    return root / locale / "LC_MESSAGES" / "django.po"


def entries(po: Path, *flags: str) -> list[str]:
    """The msgids of `po`'s entries that `msgattrib` selects with `flags` (one line each)."""
    out = subprocess.run(
        [tool("msgattrib"), "--no-wrap", "--no-obsolete", *flags, str(po)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [m for m in re.findall(r'^msgid "(.*)"$', out, re.M) if m]


def compiled(po: Path, tmp_path: Path) -> dict:
    mo = tmp_path / f"{po.parent.parent.name}-{abs(hash(po))}.mo"
    subprocess.run([tool("msgfmt"), "--check", "-o", str(mo), str(po)], check=True, capture_output=True)
    return catalog(mo)


def catalog(mo: Path) -> dict:
    """msgid (or (msgid, n) for a plural) → translation; the header (msgid "", dates) left out."""
    with mo.open("rb") as fh:
        return {k: v for k, v in gettext.GNUTranslations(fh)._catalog.items() if k != ""}


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> Path:
    """The catalogs as makemessages leaves them after reading today's code: a copy of the committed ones,
    merged with every marked string (new ones untranslated), without the ones no longer marked."""
    tool("xgettext")
    tool("msgmerge")
    locale = tmp_path_factory.mktemp("catalogs") / "locale"
    shutil.copytree(LOCALE_DIR, locale)
    cwd = os.getcwd()
    # makemessages writes its work files beside the templates it reads: one run at a time in this tree
    # (the suite's workers, and CI's two suites, share it).
    lock = (
        Path(tempfile.gettempdir()) / f"maibot-makemessages-{hashlib.sha1(bytes(ROOT)).hexdigest()[:12]}.lock"
    ).open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.chdir(ROOT)
        with override_settings(LOCALE_PATHS=[locale]):
            call_command(
                "makemessages",
                locale=list(LOCALES),
                no_obsolete=True,
                no_location=True,
                ignore_patterns=IGNORED,
                verbosity=0,
            )
    finally:
        os.chdir(cwd)
        lock.close()
    return locale


@pytest.mark.parametrize("locale", LOCALES)
def test_every_marked_string_is_translated_and_none_is_fuzzy(extracted, locale):
    po = po_path(extracted, locale)
    assert entries(po, "--untranslated") == [], f"untranslated in {locale} (run `make messages`, translate)"
    assert entries(po, "--only-fuzzy") == [], f"fuzzy in {locale}: check and unmark them"
    committed = po_path(LOCALE_DIR, locale)
    assert entries(committed, "--untranslated") == [] and entries(committed, "--only-fuzzy") == []


@pytest.mark.parametrize("locale", LOCALES)
def test_the_committed_catalog_is_todays_and_its_mo_is_compiled_from_it(extracted, locale, tmp_path):
    committed = po_path(LOCALE_DIR, locale)
    today = compiled(po_path(extracted, locale), tmp_path)
    assert compiled(committed, tmp_path) == today, f"{locale}: strings the code no longer has (make messages)"
    assert catalog(committed.with_suffix(".mo")) == today, f"{locale}: django.mo is stale (make messages)"


def test_the_chinese_catalog_is_chinese():
    """No entry left as an English copy (only what is the same in both: names and a bare format)."""
    zh = catalog(po_path(LOCALE_DIR, "zh_Hans").with_suffix(".mo"))
    english = [msgid for msgid, text in zh.items() if not re.search(r"[\u4e00-\u9fff]", text)]
    assert set(english) == {"ID", "id", "uid", "API", "%(verb)s %(count)d %(noun)s."}


def test_the_languages_are_the_catalogs():
    assert [code for code, _ in settings.LANGUAGES] == ["zh-hans", "en"]
    assert {p.name for p in LOCALE_DIR.iterdir() if p.is_dir()} == set(LOCALES)
