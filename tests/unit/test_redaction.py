"""Redaction (spec §6.5–§6.6): what Jev and the event log get to see of a customer's message."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projections.redaction import (
    REDACTED,
    cut_utf16,
    email_domain,
    is_usable,
    sanitize,
    utf16_units,
)

R = REDACTED
MAX_TEXT_UNITS = 1600  # behavior.md §6.6 (d): cut to 1,600 characters (JavaScript's, i.e. UTF-16 code units)


def redact(text: str, name: str | None = None, email: str | None = None) -> str:
    return sanitize(text, name, email)


# --- acceptance vectors of §6.6 ---------------------------------------------------------------------------


def test_alice_chen_vector() -> None:
    text = (
        "Hi, I'm Alice Chen (alice.chen@example.com, +1 415-555-0199). See https://cloud.example.com/x; "
        "wallet 0x52908400098527886E0F7030069857D2E4169EE7 and "
        "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY, "
        "key Zq9x_abcdefghijklmnopqrstuvwxyz0123456789ABCD, ip 10.1.2.3, ping @alicec. Thanks, Alice"
    )
    expected = (
        "Hi, I'm [REDACTED] ([REDACTED], [REDACTED]). See [REDACTED] wallet [REDACTED] and [REDACTED], "
        "key [REDACTED], ip [REDACTED], ping [REDACTED] Thanks, [REDACTED]"
    )
    assert sanitize(text, "Alice Chen", "alice.chen@example.com") == expected


def test_email_rule_runs_before_names() -> None:
    assert sanitize("example@example.com", "Example Customer", None) == R


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2001:db8::1", R),
        ("2001:db8:1234::192.0.2.1", R),
        ("::ffff:198.51.100.7", R),
        ("fe80::1%eth0", R),
        ("10.1.2.3", R),
        ("remote_addr:203.0.113.8", f"remote_addr:{R}"),
        ("ip:2001:db8::1", f"ip:{R}"),
        ("198.51.100.7:443", f"{R}:443"),
        ("client:198.51.100.9:http", f"client:{R}:http"),
        ("fe80::1:abcd", R),
        ("10:30:00", "10:30:00"),
        ("aa:bb:cc:dd:ee:ff", "aa:bb:cc:dd:ee:ff"),
        ("v1.2.3.4", "v1.2.3.4"),
        ("1.2.3.4.5", "1.2.3.4.5"),
        ("std::vec", "std::vec"),
    ],
)
def test_ip_vectors(text: str, expected: str) -> None:
    assert redact(f"at {text} now") == f"at {expected} now"
    assert redact(text) == expected


@pytest.mark.parametrize(
    "body", ["", "jane@example.com", "Jane Doe", "0x52908400098527886E0F7030069857D2E4169EE7"]
)
def test_identifier_only_inputs_are_not_usable(body: str) -> None:
    for raw in (body, f"\n{body}"):  # §6.5 builds subject + "\n" + body; a missing subject is ""
        text = sanitize(raw, "Jane Doe", "jane@example.com")
        assert not is_usable(text), text


def test_token_with_punctuation_is_usable_and_keeps_the_token() -> None:
    text = sanitize("jane@example.com!", None, None)
    assert text == f"{R}!"
    assert is_usable(text)


# --- 1 e-mail ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail a.b+c-d_e@sub-x.example.co today", f"mail {R} today"),
        ("JANE@EXAMPLE.COM", R),
        ("(mail:jane@example.com)", f"(mail:{R})"),
        ("jane@example.com.", f"{R}."),
        ("jane@example.com_x", "jane@example.com_x"),  # followed by a word character
        ("jane@example.c", "jane@example.c"),  # one-letter top-level domain
        ("jane@example.c0m", "jane@example.c0m"),
        ("ｊａｎｅ＠ｅｘａｍｐｌｅ．ｃｏｍ", R),  # NFKC first
    ],
)
def test_email_pattern(text: str, expected: str) -> None:
    assert redact(text) == expected


# --- 2 URL -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see https://x.example/a?b=c; next", f"see {R} next"),  # trailing punctuation swallowed
        ("HTTP://EXAMPLE.COM/Path", R),
        ("ftp://files.example/x.zip", R),
        ("visit www.example.com.", f"visit {R}"),
        ("(https://x.example/z)", f"({R})"),
        ("<https://x.example/z>", f"<{R}>"),
        ("xhttps://x.example", "xhttps://x.example"),  # no word boundary before
        ("xwww.example.com", "xwww.example.com"),
        ("éhttps://x.example", f"é{R}"),  # the boundary is ASCII: é is not a word character
        ("https://x.example\u2028next", f"{R} next"),  # JavaScript whitespace ends the URL
        ("https://x.example\x85next", R),  # NEL is not JavaScript whitespace
    ],
)
def test_url_pattern(text: str, expected: str) -> None:
    assert redact(text) == expected


# --- 3 hex id ----------------------------------------------------------------------------------------------

HEX20 = "0123456789abcdef0123"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (HEX20, R),
        (HEX20[:19], HEX20[:19]),
        ("0x" + HEX20, R),
        ("0X" + HEX20.upper(), R),
        ("-" + HEX20 + ".", f"-{R}."),
        ("g" + HEX20, "g" + HEX20),  # word character before
        (HEX20 + "g", HEX20 + "g"),  # word character after
        ("é" + HEX20, f"é{R}"),  # ASCII word boundary
    ],
)
def test_hex_pattern(text: str, expected: str) -> None:
    assert redact(text) == expected


# --- 4 base58 ----------------------------------------------------------------------------------------------

B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"  # 58 characters


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (B58[:32], R),
        (B58[:31], B58[:31]),
        (B58[:33] + "0", f"{R}0"),  # bounded by the alphabet, not by word characters
        ("l" + B58[:32], f"l{R}"),
        (B58[:16] + "o" + B58[16:32], R),  # lower-case o is in the alphabet
        (B58[:16] + "O" + B58[16:32], B58[:16] + "O" + B58[16:32]),  # upper-case O is not
    ],
)
def test_base58_pattern(text: str, expected: str) -> None:
    assert redact(text) == expected


# --- 5 key/token -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key " + "abc/" * 10, f"key {R}"),
        ("key " + ("abc/" * 10)[:39], "key " + ("abc/" * 10)[:39]),
        ("YW0/" * 10 + "==!", f"{R}!"),  # padding belongs to the token
        ("x." + "ab_-" * 10, f"x.{R}"),
    ],
)
def test_key_pattern(text: str, expected: str) -> None:
    """Runs of 40+ token characters; base58 runs are taken first by rule 4, so these contain '/' or '_'."""
    assert redact(text) == expected


# --- 6 phone -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("call 4155550199", f"call {R}"),
        ("call 415555019", "call 415555019"),  # nine digits
        ("call +44 20 7946 0958 now", f"call {R} now"),
        ("(415) 555-0199", f"({R}"),  # starts at a digit
        ("415\t555\t0199", "415 555 0199"),  # only a literal space joins groups
        ("415.555.0199", "415.555.0199"),
        ("id_4155550199", "id_4155550199"),  # word character before
        ("4155550199x", "4155550199x"),  # word character after
        ("on 2024-01-15 10:30", f"on {R}:30"),  # known over-redaction of ISO dates
        ("٤١٥٥٥٥٠١٩٩", "٤١٥٥٥٥٠١٩٩"),  # digits are ASCII digits
        ("４１５５５５０１９９", R),  # fullwidth digits become ASCII under NFKC
    ],
)
def test_phone_pattern(text: str, expected: str) -> None:
    assert redact(text) == expected


# --- 7 IPv6 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2001:0db8:0000:0000:0000:ff00:0042:8329", R),
        ("2001:DB8::1", R),
        ("1::", R),
        ("=::1", f"={R}"),
        ("g::1", "g::1"),  # word character before
        ("2001:db8::1x", "2001:db8::1x"),  # word character after
        ("1:2:3:4:5:6:7:8", R),
        ("1:2:3:4:5:6:7:8:", "1:2:3:4:5:6:7:8:"),  # ':' after
        ("fe80::1%eth0_x", f"{R}%eth0_x"),  # the zone id backs off, the address stays redacted
        ("x2001:db8::1", f"x2001:{R}"),  # a later group can start a match after ':'
    ],
)
def test_ipv6_pattern(text: str, expected: str) -> None:
    assert redact(text) == expected


# --- 8 IPv4 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("255.255.255.255", R),
        ("0.0.0.0", R),
        ("256.1.1.1", "256.1.1.1"),
        ("01.2.3.4", "01.2.3.4"),  # no leading zeros
        ("1.2.3.04", "1.2.3.04"),
        ("1.2.3.4.", f"{R}."),  # '.' not followed by a digit is fine
        ("x.1.2.3.4", f"x.{R}"),  # '.' after a non-digit is fine
        ("host-1.2.3.4", f"host-{R}"),
        ("1.2.3.4-beta", f"{R}-beta"),
    ],
)
def test_ipv4_pattern(text: str, expected: str) -> None:
    assert redact(text) == expected


# --- 9 handle ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ping @ab", f"ping {R}"),
        ("ping @a", "ping @a"),
        ("(@a.b-c_d)", f"({R})"),
        ("x@ab", "x@ab"),  # word character before
        ("@@ab", f"@{R}"),
        ("@Ünïcode", "@Ünïcode"),  # handle characters are ASCII
    ],
)
def test_handle_pattern(text: str, expected: str) -> None:
    assert redact(text) == expected


# --- contact names -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "email", "expected"),
    [
        ("J went home", "J Smith", None, "J went home"),  # one-character parts are dropped
        ("Jo went home", "Jo Smith", None, f"{R} went home"),
        ("Anna-Lena here", "Anna Anna-Lena", None, f"{R} here"),  # longest first
        ("Annual report by Ann's team", "Ann", None, f"Annual report by {R}'s team"),
        ("éAnn", "Ann", None, f"é{R}"),  # only ASCII word characters block a match
        ("élodie est là", "ÉLODIE", None, f"{R} est là"),
        ("οδυσσευς", "ΟΔΥΣΣΕΥΣ", None, R),  # σ, ς and Σ fold together
        ("straße", "STRAẞE", None, R),  # simple folding: ẞ → ß
        ("Straße", "Strasse", None, "Straße"),  # but not full folding (ß ≠ ss)
        ("ALİ and alı", "Ali", None, "ALİ and alı"),  # İ and ı do not fold to i
        ("J.R. says JxRx", "J.R.", None, f"{R} says JxRx"),  # names are literal
        ("fiona", "ﬁona", None, "fiona"),  # names are not NFKC-normalised
        ("Jane says hi", "Mary\u00a0Jane", None, f"{R} says hi"),  # JavaScript whitespace splits parts
        ("from jane!doe@example today", None, "jane!doe@example", f"from {R} today"),
        ("Jane Doe", None, None, "Jane Doe"),  # no contact identities, nothing to match
        ("", "Jane Doe", "jane@example.com", ""),
    ],
)
def test_contact_names(text: str, name: str | None, email: str | None, expected: str) -> None:
    assert sanitize(text, name, email) == expected


# --- NFKC, whitespace, the cut -----------------------------------------------------------------------------


def test_nfkc_normalises_text() -> None:
    assert redact("ﬁne ＡＢＣ ①") == "fine ABC 1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  a \t\n b\r\n\n c  ", "a b c"),
        ("\ufeffa\u2028b\u2029c\u1680d\u3000", "a b c d"),
        ("a\x85b\x1cc", "a\x85b\x1cc"),  # Python whitespace that JavaScript does not treat as whitespace
    ],
)
def test_whitespace_is_collapsed_and_trimmed(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_cut_at_1600_units_counts_emoji_as_two() -> None:
    assert redact("😀" * 1000) == "😀" * 800
    assert redact("é" * 1598 + "😀b") == "é" * 1598 + "😀"
    # A cut that would split the pair drops the emoji whole (JavaScript would keep half of it).
    assert redact("é" * 1599 + "😀") == "é" * 1599
    assert redact("word " * 400) == ("word " * 320)[:1600]


def test_cut_happens_after_collapsing_whitespace() -> None:
    text = "a" + " " * 5000 + "b"
    assert redact(text) == "a b"


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("abc", 5, "abc"),
        ("abc", 0, ""),
        ("abc", -1, ""),
        ("ab😀c", 3, "ab"),
        ("ab😀c", 4, "ab😀"),
        ("ab😀c", 5, "ab😀c"),
        ("€uro", 1, "€"),  # BMP characters are one unit whatever their UTF-8 size
    ],
)
def test_cut_utf16(text: str, limit: int, expected: str) -> None:
    assert cut_utf16(text, limit) == expected


def test_unpaired_surrogates_become_replacement_characters() -> None:
    out = redact("a\ud800b \ud83d\ude00")
    assert out == "a\ufffdb 😀"
    out.encode("utf-8")


# --- is_usable and email_domain ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "usable"),
    [
        ("", False),
        (R, False),
        (f"{R} {R}", False),
        (f"{R}{R}\u3000", False),
        (f"{R}!", True),
        ("[REDACTED", True),
        ("ok", True),
    ],
)
def test_is_usable(text: str, usable: bool) -> None:
    assert is_usable(text) is usable


@pytest.mark.parametrize(
    ("email", "domain"),
    [
        (None, None),
        ("", None),
        ("jane", None),
        ("jane@", None),
        ("jane@Example.COM", "Example.COM"),
        ("a@b@c", "b"),
        ("@x", "x"),
        ("jane@ exämple ", " exämple "),
    ],
)
def test_email_domain(email: str | None, domain: str | None) -> None:
    assert email_domain(email) == domain


# --- properties and size -----------------------------------------------------------------------------------

# Webhook JSON can carry unpaired surrogates ("\ud83d"); st.text() never generates them.
any_chars = st.characters() | st.characters(categories=["Cs"])
any_text = st.lists(any_chars, max_size=300).map("".join)
idents = st.none() | st.lists(any_chars, max_size=40).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=any_text, name=idents, email=idents)
def test_sanitize_never_raises_and_stays_within_the_limit(
    text: str, name: str | None, email: str | None
) -> None:
    out = sanitize(text, name, email)
    assert utf16_units(out) <= MAX_TEXT_UNITS
    out.encode("utf-8")


def test_long_text_is_cut() -> None:
    out = sanitize("Hello there. " * 500, None, None)
    assert utf16_units(out) == MAX_TEXT_UNITS


local_parts = st.from_regex(r"[a-z0-9]{1,8}(\.[a-z0-9]{1,8}){0,2}", fullmatch=True)
domains = st.from_regex(r"[a-z0-9]{1,8}(\.[a-z0-9]{1,8}){0,2}\.[a-z]{2,6}", fullmatch=True)
fragments = st.text(max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    local=local_parts,
    domain=domains,
    before=fragments,
    after=fragments,
    name=idents,
    upper=st.booleans(),
)
def test_plain_contact_email_never_survives(
    local: str, domain: str, before: str, after: str, name: str | None, upper: bool
) -> None:
    email = f"{local}@{domain}"
    written = email.upper() if upper else email
    out = sanitize(f"{before}{written}{after} {written}", name, email)
    standalone = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(email)}(?![A-Za-z0-9_])", re.ASCII | re.IGNORECASE)
    assert standalone.search(out) is None, out


@pytest.mark.parametrize(
    "text",
    [
        "1" * 100_000 + "a",
        "(1" * 50_000 + "x",
        "a@" * 50_000,
        "x@" + "a." * 50_000,
        ":a" * 50_000,
        "1::1%" + "a" * 100_000 + "_",
        "Alice chen, " * 9_000,
        "😀 " * 50_000,
        ("https://x.example/" + "a" * 1000 + " 10.0.0.1 ") * 95,
    ],
)
def test_large_inputs_complete(text: str) -> None:
    out = sanitize(text, "Alice Chen", "alice@example.com")
    assert utf16_units(out) <= MAX_TEXT_UNITS
