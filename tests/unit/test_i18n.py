"""Every bot message has a Simplified Chinese translation, and the catalogs match the source."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from babel.messages.pofile import read_po

from bot.i18n import LOCALES, Catalogs

REPO = Path(__file__).resolve().parents[2]


def _catalog(locale: str):
    with (LOCALES / locale / "LC_MESSAGES" / "messages.po").open("rb") as f:
        return read_po(f, locale=locale)


def _compiled(locale: str) -> dict[str, str]:
    import gettext
    with (LOCALES / locale / "LC_MESSAGES" / "messages.mo").open("rb") as f:
        return {k: v for k, v in gettext.GNUTranslations(f)._catalog.items() if isinstance(k, str) and k}


def test_committed_mo_catalogs_match_their_po_sources():
    for locale in ("en", "zh_Hans"):
        po = {m.id: m.string for m in _catalog(locale) if m.id and m.string and not m.fuzzy}
        assert _compiled(locale) == po, f"bot/locales/{locale}: the .mo is stale; run `make i18n-compile` and commit it"


def test_the_po_files_are_the_only_source_of_translations():
    assert not list((REPO / "bot").rglob("translate_zh.py")) and not (REPO / "locales").exists(), \
        "translations live in bot/locales/*/LC_MESSAGES/messages.po only"


def test_every_message_has_a_chinese_translation():
    missing = [m.id for m in _catalog("zh_Hans") if m.id and (not m.string or m.fuzzy)]
    assert missing == [], f"untranslated in bot/locales/zh_Hans: {missing}; run `make i18n-update` and translate them"


def test_catalogs_cover_every_message_in_the_source(tmp_path: Path):
    pot = tmp_path / "messages.pot"
    subprocess.run([sys.executable, "-m", "babel.messages.frontend", "extract", "-F", "bot/locales/babel.cfg",
                    "--no-default-keywords", "-k", "_", "--no-location", "-o", str(pot), "."],
                   cwd=REPO, check=True, capture_output=True)
    with pot.open("rb") as f:
        source = {m.id for m in read_po(f) if m.id}
    zh = {m.id for m in _catalog("zh_Hans") if m.id and m.string}
    assert source - zh == set(), f"messages missing from the catalogs: {source - zh}; run `make i18n-update`"


def test_placeholders_survive_translation():
    import re
    for m in _catalog("zh_Hans"):
        if m.id:
            assert sorted(re.findall(r"{\w+}", m.id)) == sorted(re.findall(r"{\w+}", m.string)), m.id


def test_text_gives_both_languages():
    tr = Catalogs()
    assert tr.text("Page {page}", page=2) == {"en_us": "Page 2", "zh_cn": "第 2 页"}
