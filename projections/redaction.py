"""Redaction of customer text before it leaves the router or enters the event log (spec §6.5–§6.6).

The earlier router ran these rules as JavaScript regular expressions; this port keeps JavaScript's
results, so the same message yields the same redacted text (and the same memo hash):

- Patterns use explicit ASCII classes and ``re.ASCII`` (JavaScript's ``\\w``, ``\\d``, ``\\b`` and its
  non-Unicode ``i`` flag only ever match ASCII here; Python's Unicode defaults would not, e.g. Python's
  ``[a-z]`` with ``re.I`` matches ``İ``).
- Whitespace is JavaScript's ``\\s`` / ``trim()`` set, not Python's ``str.isspace`` (which adds U+001C–U+001F
  and U+0085 and lacks U+FEFF).
- Variable-width look-behinds are split into fixed-width ones, which Python's ``re`` requires.
- Contact names match with Unicode *simple* case folding, as a JavaScript ``/iu`` regex does; Python's
  ``re.IGNORECASE`` differs (it equates ``i`` with ``ı`` and ``İ``), so names are matched by folding
  both sides code point by code point and searching literally.
- Lengths and cuts are in UTF-16 code units, as JavaScript counts them.

One deliberate divergence: JavaScript strings may hold unpaired surrogates and ``slice`` may split a
pair, but such text cannot be encoded as UTF-8 for Kafka records or HTTP bodies. So ``sanitize`` turns an
unpaired surrogate into U+FFFD (one code unit, like the surrogate, so every later position and cut is
unchanged), and ``cut_utf16`` drops a character whose pair the cut would split (the result is then one
unit shorter than JavaScript's, which would end in a lone high surrogate).
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache

__all__ = [
    "MAX_TEXT_UNITS",
    "REDACTED",
    "cut_utf16",
    "email_domain",
    "is_usable",
    "sanitize",
    "utf16_units",
]

REDACTED = "[REDACTED]"
"""The literal token that replaces every redacted span."""

MAX_TEXT_UNITS = 1600
"""Maximum length of a sanitized text, in UTF-16 code units."""

# JavaScript's WhiteSpace and LineTerminator code points: what `\s` matches and `trim()` removes.
_WS_CHARS = (
    "\t\n\x0b\x0c\r \xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_WS = "".join(re.escape(char) for char in _WS_CHARS)
_WS_RUN = re.compile(f"[{_WS}]+")

_WORD = "A-Za-z0-9_"  # JavaScript's \w (ASCII only)
_NOT_AFTER_WORD = f"(?<![{_WORD}])"
_NOT_BEFORE_WORD = f"(?![{_WORD}])"
_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

# npm ip-regex v5: an IPv4 dotted quad (octets without leading zeros, longest alternative first) and
# its non-exact IPv6 pattern (full and "::"-compressed forms, optional embedded IPv4, optional zone id).
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
_V4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_SEG = "[a-fA-F0-9]{1,4}"
_V6 = (
    "(?:"
    + "|".join(
        [
            f"(?:{_SEG}:){{7}}(?:{_SEG}|:)",
            f"(?:{_SEG}:){{6}}(?:{_V4}|:{_SEG}|:)",
            f"(?:{_SEG}:){{5}}(?::{_V4}|(?::{_SEG}){{1,2}}|:)",
            f"(?:{_SEG}:){{4}}(?:(?::{_SEG}){{0,1}}:{_V4}|(?::{_SEG}){{1,3}}|:)",
            f"(?:{_SEG}:){{3}}(?:(?::{_SEG}){{0,2}}:{_V4}|(?::{_SEG}){{1,4}}|:)",
            f"(?:{_SEG}:){{2}}(?:(?::{_SEG}){{0,3}}:{_V4}|(?::{_SEG}){{1,5}}|:)",
            f"(?:{_SEG}:){{1}}(?:(?::{_SEG}){{0,4}}:{_V4}|(?::{_SEG}){{1,6}}|:)",
            f"(?::(?:(?::{_SEG}){{0,5}}:{_V4}|(?::{_SEG}){{1,7}}|:))",
        ]
    )
    + ")(?:%[0-9a-zA-Z]{1,})?"
)

_B58 = "1-9A-HJ-NP-Za-km-z"
_KEY = "A-Za-z0-9_+/=-"
_URL_CHAR = f"[^{_WS}<>()]"
_I = re.ASCII | re.IGNORECASE

# The nine patterns of §6.6, applied in this order.
_PATTERNS: tuple[re.Pattern[str], ...] = (
    # 1 e-mail
    re.compile(rf"(?<![A-Za-z0-9_.+-])[A-Za-z0-9_.+-]+@[A-Za-z0-9_.-]+\.[a-z]{{2,}}{_NOT_BEFORE_WORD}", _I),
    # 2 URL (swallows trailing punctuation, as the original did)
    re.compile(rf"\b(?:https?|ftp)://{_URL_CHAR}+|\bwww\.{_URL_CHAR}+", _I),
    # 3 hex id
    re.compile(r"\b(?:0x)?[0-9a-f]{20,}\b", _I),
    # 4 base58
    re.compile(f"(?<![{_B58}])[{_B58}]{{32,64}}(?![{_B58}])", re.ASCII),
    # 5 key/token
    re.compile(f"(?<![{_KEY}])[{_KEY}]{{40,}}(?![{_KEY}])", re.ASCII),
    # 6 phone: literal spaces only (whitespace is collapsed after redaction)
    re.compile(rf"{_NOT_AFTER_WORD}\+?[0-9][0-9 ()-]{{8,}}[0-9]{_NOT_BEFORE_WORD}", re.ASCII),
    # 7 IPv6
    re.compile(f"{_NOT_AFTER_WORD}{_V6}(?![{_WORD}:])", _I),
    # 8 IPv4; "not after a word char or a digit + '.'" split into two fixed-width look-behinds
    re.compile(rf"{_NOT_AFTER_WORD}(?<![0-9]\.){_V4}{_NOT_BEFORE_WORD}(?!\.[0-9])", re.ASCII),
    # 9 handle
    re.compile(f"{_NOT_AFTER_WORD}@[A-Za-z0-9_.-]{{2,}}", re.ASCII),
)

_SURROGATE = re.compile("[\ud800-\udfff]")


def sanitize(text: str, name: str | None, email: str | None) -> str:
    """Redact ``text`` as §6.6 says: NFKC, the nine patterns, the contact's identities, whitespace, cut.

    ``name`` and ``email`` are the conversation contact's (``meta.sender.name`` / ``.email``); either may
    be missing. The result is at most ``MAX_TEXT_UNITS`` UTF-16 code units long.
    """
    text = unicodedata.normalize("NFKC", _well_formed(text))
    for pattern in _PATTERNS:
        text = pattern.sub(REDACTED, text)
    for identity in _identities(name, email):
        text = _redact_literal(text, identity)
    text = _WS_RUN.sub(" ", text).strip(_WS_CHARS)
    return cut_utf16(text, MAX_TEXT_UNITS)


def is_usable(text: str) -> bool:
    """True when a sanitized text says something besides redaction tokens (§6.5 step 4)."""
    return bool(text.replace(REDACTED, "").strip(_WS_CHARS))


def cut_utf16(text: str, limit: int) -> str:
    """The longest prefix of ``text`` that fits in ``limit`` UTF-16 code units.

    Like JavaScript's ``slice(0, limit)``, except that a character whose surrogate pair the cut would
    split is dropped whole instead of leaving an unencodable lone high surrogate.
    """
    if limit <= 0:
        return ""
    if len(text) * 2 <= limit:
        return text
    units = 0
    for index, char in enumerate(text):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > limit:
            return text[:index]
    return text


def email_domain(email: str | None) -> str | None:
    """The raw part after the first ``@`` (up to a second ``@``), or None when absent or empty (§6.5)."""
    if not email or "@" not in email:
        return None
    return email.split("@")[1] or None


def utf16_units(text: str) -> int:
    """Length in UTF-16 code units, counting an unpaired surrogate as one unit (never raises)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _well_formed(text: str) -> str:
    """Join surrogate code points that form pairs and replace unpaired ones with U+FFFD."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _identities(name: str | None, email: str | None) -> list[str]:
    """Whole identities and their whitespace parts, ≥ 2 units, de-duplicated, longest first (stable)."""
    found: list[str] = []
    for identity in (name, email):
        if not identity:
            continue
        identity = _well_formed(identity)
        for candidate in (identity, *_WS_RUN.split(identity)):
            if utf16_units(candidate) >= 2 and candidate not in found:
                found.append(candidate)
    return sorted(found, key=utf16_units, reverse=True)


def _redact_literal(text: str, needle: str) -> str:
    """Replace ``needle`` case-insensitively (simple case folding) where no ASCII word char touches it."""
    table = _fold_table()
    folded_text = text.translate(table)
    folded_needle = needle.translate(table)
    size = len(folded_needle)
    parts: list[str] = []
    kept_from = search_from = 0
    while (start := folded_text.find(folded_needle, search_from)) != -1:
        end = start + size
        if (start == 0 or text[start - 1] not in _WORD_CHARS) and (
            end == len(text) or text[end] not in _WORD_CHARS
        ):
            parts += (text[kept_from:start], REDACTED)
            kept_from = search_from = end
        else:
            search_from = start + 1
    if not parts:
        return text
    parts.append(text[kept_from:])
    return "".join(parts)


@cache
def _fold_table() -> dict[int, int]:
    """Unicode simple case folding (CaseFolding.txt C + S) for every code point it changes.

    Folding maps one code point to one code point, so positions in folded text are positions in the
    original. Python exposes only full folding (``str.casefold``); where that yields several code points
    the simple folding is the single-code-point lower case (e.g. ẞ → ß), else the character itself
    (ß, İ). No code point above U+1FFFF has a case.
    """
    table: dict[int, int] = {}
    for code in range(0x20000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        folded = char.casefold()
        if len(folded) != 1:
            lower = char.lower()
            folded = lower if len(lower) == 1 else char
        if folded != char:
            table[code] = ord(folded)
    return table
