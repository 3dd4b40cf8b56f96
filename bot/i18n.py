"""Babel catalogs for the bot: every user-facing string in English and Simplified Chinese.

Messages are English msgids marked with `_()` (extracted by `make i18n-extract`). `Catalogs.text`
returns one string per card language (`en_us`, `zh_cn`) for `i18n_content` and toast `i18n`.
The catalogs are package data (`bot/locales/<locale>/LC_MESSAGES/messages.{po,mo}`), read through
`importlib.resources`, so an installed wheel carries them. The `.po` files are the only source of
translations; the compiled `.mo` files are committed beside them (`make i18n-compile`) because the wheel
ships only those. A `.po` newer than its `.mo` (an edit not compiled yet, in a source checkout) is read directly.
"""
from __future__ import annotations

import gettext
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

DOMAIN = "messages"
LANGS = {"en_us": "en", "zh_cn": "zh_Hans"}  # card language → Babel locale folder
LOCALES: Traversable = resources.files("bot") / "locales"


def _(message: str) -> str:
    """Mark `message` for extraction; translation happens when a card is rendered."""
    return message


def _po_is_newer(po: Traversable, mo: Traversable) -> bool:
    if not po.is_file():
        return False
    if not mo.is_file():
        return True
    if isinstance(po, Path) and isinstance(mo, Path):
        return po.stat().st_mtime > mo.stat().st_mtime
    return False


def _load(root: Traversable, locale: str) -> dict[str, str]:
    folder = root / locale / "LC_MESSAGES"
    po, mo = folder / f"{DOMAIN}.po", folder / f"{DOMAIN}.mo"
    if _po_is_newer(po, mo):
        from babel.messages.pofile import read_po  # only a source checkout with an uncompiled edit needs Babel here

        with po.open("rb") as f:
            catalog = read_po(f, locale=locale)
        return {m.id: m.string for m in catalog if m.id and isinstance(m.id, str) and m.string and not m.fuzzy}
    if not mo.is_file():
        return {}
    with mo.open("rb") as f:
        return {k: v for k, v in gettext.GNUTranslations(f)._catalog.items() if isinstance(k, str) and k}  # noqa: SLF001


class Catalogs:
    """The loaded translations of every card language."""

    def __init__(self, root: Traversable | Path = LOCALES) -> None:
        self.tables = {lang: _load(root, loc) for lang, loc in LANGS.items()}

    def gettext(self, lang: str, message: str) -> str:
        """Return `message` translated into card language `lang` (the msgid when untranslated)."""
        return self.tables.get(lang, {}).get(message) or message

    def text(self, message: str, **values: Any) -> dict[str, str]:
        """Return `{en_us: …, zh_cn: …}` for `message` with `values` substituted: a value that is itself such a
        bilingual text (a translated word) is substituted language by language; others are not translated."""
        return {lang: self.gettext(lang, message).format(**{k: v[lang] if isinstance(v, dict) else v
                                                            for k, v in values.items()}) for lang in LANGS}


_DEFAULT: Catalogs | None = None


def catalogs() -> Catalogs:
    """Return the process-wide catalogs (read once; they are immutable data)."""
    global _DEFAULT  # noqa: PLW0603 — a read-only cache of files shipped with the package
    if _DEFAULT is None:
        _DEFAULT = Catalogs()
    return _DEFAULT
