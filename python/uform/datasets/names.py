"""Real text pairs across scripts, offline: names of countries, currencies and languages in other languages → English.

``pycountry`` ships the ISO 3166-1 (countries), ISO 4217 (currencies) and ISO 639-3 (languages)
tables with the Debian iso-codes project's translations as gettext catalogs, about 160 locales. Each
translation that differs from its English name is a pair: the query the translated name
("Deutschland", "Германия", "ドイツ"), the document the English one ("Germany"); translations that several
locales spell alike count once. That is about 121,000 pairs (pycountry 26.2) over 8,300 names in Latin,
Cyrillic, Greek, Arabic, Hebrew, Devanagari, CJK and other scripts, where a bag of bytes or BM25 often finds
nothing shared between query and document. A query string can name two documents (a country and its
language, spelt alike in some language): about 1,000 of them do.

Licence: the iso-codes data and its translations are LGPL-2.1-or-later (as is pycountry); nothing of
them is copied into this repository, they are read from the installed package.

:func:`name_pairs` answers the pairs in a fixed order (table, then name, then locale, each sorted). The
held-out split of ``python -m uform train --data names`` is by document (``split_by_document``): a
held-out English name, and every translation of it, never trains (a held-out query's string can still
recur as another name's translation).
"""

from __future__ import annotations

import gettext
import os

from ..pairs.jsonl import Pair

TABLES = (("iso3166-1", "countries"), ("iso4217", "currencies"), ("iso639-3", "languages"))
"""The gettext domain and pycountry database of each table read, in order."""


def name_pairs() -> list[Pair]:
    """Every (translated name, English name) pair of :data:`TABLES` (module doc)."""
    try:
        import pycountry
    except ImportError:
        from ..errors import ErrorCode, UFormError

        raise UFormError(ErrorCode.UNSUPPORTED, "the names data set needs pycountry (pip install pycountry)") from None
    base = pycountry.LOCALES_DIR
    locales = sorted(os.listdir(base))
    pairs = []
    for domain, attribute in TABLES:
        names = sorted({entry.name for entry in getattr(pycountry, attribute)})
        catalogs = [gettext.translation(domain, base, languages=[locale]) for locale in locales
                    if os.path.exists(os.path.join(base, locale, "LC_MESSAGES", f"{domain}.mo"))]
        for name in names:
            translations = {catalog.gettext(name) for catalog in catalogs} - {name}
            pairs += [Pair(query=translation, document=name) for translation in sorted(translations)]
    return pairs
