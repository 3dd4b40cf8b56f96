"""Babel catalogs for the bot: every user-facing string in English and Simplified Chinese.

Messages are English msgids marked with `_()` (extracted by `make i18n-extract`). `Catalogs.text`
returns one string per card language (`en_us`, `zh_cn`) for `i18n_content` and toast `i18n`.
A compiled `.mo` is used when it is at least as new as its `.po`; otherwise the `.po` is read directly,
so a fresh checkout works without a build step.
"""
from __future__ import annotations

import gettext
from pathlib import Path
from typing import Any

from babel.messages.pofile import read_po

LOCALES = Path(__file__).resolve().parent.parent / "locales"
DOMAIN = "messages"
LANGS = {"en_us": "en", "zh_cn": "zh_Hans"}  # card language → Babel locale folder


def _(message: str) -> str:
    """Mark `message` for extraction; translation happens when a card is rendered."""
    return message


def _load(root: Path, locale: str) -> dict[str, str]:
    folder = root / locale / "LC_MESSAGES"
    po, mo = folder / f"{DOMAIN}.po", folder / f"{DOMAIN}.mo"
    if mo.exists() and (not po.exists() or mo.stat().st_mtime >= po.stat().st_mtime):
        with mo.open("rb") as f:
            return {k: v for k, v in gettext.GNUTranslations(f)._catalog.items() if isinstance(k, str) and k}  # noqa: SLF001
    if not po.exists():
        return {}
    with po.open("rb") as f:
        catalog = read_po(f, locale=locale)
    return {m.id: m.string for m in catalog if m.id and isinstance(m.id, str) and m.string and not m.fuzzy}


class Catalogs:
    """The loaded translations of every card language."""

    def __init__(self, root: Path = LOCALES) -> None:
        self.tables = {lang: _load(root, loc) for lang, loc in LANGS.items()}

    def gettext(self, lang: str, message: str) -> str:
        """Return `message` translated into card language `lang` (the msgid when untranslated)."""
        return self.tables.get(lang, {}).get(message) or message

    def text(self, message: str, **values: Any) -> dict[str, str]:
        """Return `{en_us: …, zh_cn: …}` for `message` with `values` substituted (values are not translated)."""
        return {lang: self.gettext(lang, message).format(**values) for lang in LANGS}


_DEFAULT: Catalogs | None = None


def catalogs() -> Catalogs:
    """Return the process-wide catalogs (read once; they are immutable data)."""
    global _DEFAULT  # noqa: PLW0603 — a read-only cache of files shipped with the package
    if _DEFAULT is None:
        _DEFAULT = Catalogs()
    return _DEFAULT
