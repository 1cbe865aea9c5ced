"""How every Kafka client of the router connects: TLS and SASL from a Java client properties file and the environment.

The contract (DESIGN §9, docs/operations.md "Connecting to a secured Kafka"): `KAFKA_CLIENT_PROPERTIES` names the
properties file a cluster's administrator (or Confluent Cloud) hands out, read with java.util.Properties' syntax
so the block works as it is; `KAFKA_SECURITY_PROTOCOL`, `KAFKA_SASL_*` and `KAFKA_SSL_*` may come on top (a
variable wins over the file's key), with passwords also from a file (a mounted secret). This module only parses
and checks: it reads the files it is named and nothing else; `handlers/kafka/security.py` turns the result into
client options.

A setting the router cannot honour is refused by name rather than ignored, because an ignored security setting
connects differently from what the operator asked (GSSAPI, OAUTHBEARER, a JKS store, a login callback class).
Keys that are no security settings and that the router does not use (`client.dns.lookup`, `acks`, …) are
listed in `ignored` for one warning line. No error text ever holds a value, except a short enumerated one that
names what is unsupported (`GSSAPI`, `JKS`, a LoginModule class).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
TlsVersion = Literal["TLSv1.2", "TLSv1.3"]
PROTOCOLS: tuple[Protocol, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS: tuple[Mechanism, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
TLS_VERSIONS: tuple[TlsVersion, ...] = ("TLSv1.2", "TLSv1.3")

PROPERTIES_VARIABLE = "KAFKA_CLIENT_PROPERTIES"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"

SUPPORTED_KEYS = (
    "bootstrap.servers",
    "security.protocol",
    "sasl.mechanism",
    "sasl.jaas.config",
    "ssl.truststore.type",
    "ssl.truststore.location",
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "ssl.protocol",
    "ssl.enabled.protocols",
    # librdkafka's names for the same settings (Confluent's Python and Go snippets)
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
)
"""Every key of the properties file the router reads; other `ssl.*`, `sasl.*` and `security.*` keys are refused."""

DEFAULT_ONLY = {"ssl.keymanager.algorithm": "SunX509", "ssl.trustmanager.algorithm": "PKIX"}
"""Security keys accepted only with the Java client's default value (which is what the router does anyway)."""

REFUSAL_HINTS = {
    "ssl.truststore.password": "PEM trust stores take no password (leave it out)",
    "ssl.keystore.password": "PEM key stores take no store password; the private key's password is ssl.key.password",
    "ssl.truststore.certificates": "inline PEM is not supported: put the CA certificates in a file, "
    "ssl.truststore.location",
    "ssl.keystore.key": "inline PEM is not supported: put the key and certificate in a file, ssl.keystore.location",
    "ssl.keystore.certificate.chain": "inline PEM is not supported: put the key and certificate in a file, "
    "ssl.keystore.location",
    "ssl.cipher.suites": "Java cipher suite names are not supported (the router uses OpenSSL's defaults)",
    "sasl.login.callback.handler.class": "login callback classes are Java code (e.g. AWS MSK IAM); "
    "use SASL/SCRAM or mTLS",
    "sasl.client.callback.handler.class": "client callback classes are Java code (e.g. AWS MSK IAM); "
    "use SASL/SCRAM or mTLS",
    "sasl.login.class": "login classes are Java code; use SASL PLAIN or SCRAM",
}

ENV_VARIABLES = (
    PROPERTIES_VARIABLE,
    "KAFKA_SECURITY_PROTOCOL",
    "KAFKA_SASL_MECHANISM",
    "KAFKA_SASL_USERNAME",
    "KAFKA_SASL_PASSWORD",
    "KAFKA_SASL_PASSWORD_FILE",
    "KAFKA_SSL_CA_LOCATION",
    "KAFKA_SSL_CERT_LOCATION",
    "KAFKA_SSL_KEY_LOCATION",
    "KAFKA_SSL_KEY_PASSWORD",
    "KAFKA_SSL_KEY_PASSWORD_FILE",
    "KAFKA_SSL_CHECK_HOSTNAME",
)
"""The variables read here, in the order docs/operations.md lists them."""

_SHOWN_VALUE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,39}")
_LOGIN_MODULE = re.compile(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*LoginModule")
_JAVA_WHITESPACE = "".join(chr(c) for c in range(33))


class SecuritySettingError(ValueError):
    """A Kafka security setting the router cannot use; `str()` is one line naming the key or variable, never its
    value. `handlers/kafka/security.py` turns it into the commands' ConfigError (exit 2)."""

    def __init__(self, source: str, name: str, reason: str) -> None:
        self.source = source
        self.name = name
        self.reason = reason
        super().__init__(f"Invalid {source}: {name}: {reason}")


class KafkaSecurity(BaseModel):
    """The security every Kafka client of this process connects with (PLAINTEXT: none)."""

    model_config = ConfigDict(frozen=True)

    protocol: Protocol = "PLAINTEXT"
    mechanism: Mechanism | None = None
    username: str | None = None
    password: str | None = Field(None, repr=False)
    ca_file: Path | None = None  # None with TLS: the system's trusted CAs (Confluent Cloud, MSK)
    cert_file: Path | None = None  # the client certificate (mTLS), and its key unless key_file is set
    key_file: Path | None = None
    key_password: str | None = Field(None, repr=False)
    check_hostname: bool = True
    tls_versions: tuple[TlsVersion, ...] = TLS_VERSIONS
    bootstrap: str | None = None  # the file's bootstrap.servers (used when KAFKA_BOOTSTRAP_SERVERS is unset)
    ignored: tuple[str, ...] = ()  # keys of the file the router does not use, for one warning
    names: dict[str, str] = Field(default_factory=dict)  # field -> the key or variable it came from
    properties_file: str | None = None

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def name_of(self, field: str) -> str:
        """The key or variable a setting came from, for an error found when it is used (a PEM that does not load)."""
        return self.names.get(field, field)

    def error(self, field: str, reason: str) -> SecuritySettingError:
        """An error about a setting, naming where it came from."""
        return _error(self.name_of(field), reason, self.properties_file)


# --- java.util.Properties -----------------------------------------------------------------------------------------


def parse_properties(text: str) -> dict[str, str]:
    """`key=value`, `key: value` and `key value` lines as java.util.Properties.load reads them: `#` and `!`
    comment lines, a line ending in an odd number of backslashes continued on the next (its leading whitespace
    dropped), backslash escapes (`\\t`, `\\n`, `\\uXXXX`, `\\=`, …) in keys and values; the last duplicate wins.
    Values are trimmed as Kafka's ConfigDef trims them. A malformed `\\uXXXX` raises ValueError naming the line."""
    found: dict[str, str] = {}
    for number, line in _logical_lines(text):
        key, value = _split(line)
        try:
            found[_unescape(key)] = _unescape(value).strip(_JAVA_WHITESPACE)
        except ValueError:
            raise ValueError(f"line {number}: malformed \\uXXXX escape") from None
    return found


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, logical line) pairs: comments and blank lines dropped, continuations joined."""
    natural = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    lines: list[tuple[int, str]] = []
    index = 0
    while index < len(natural):
        number, line = index + 1, natural[index].lstrip(" \t\f")
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line):
            line = line[:-1]
            if index >= len(natural):
                break
            line += natural[index].lstrip(" \t\f")
            index += 1
        lines.append((number, line))
    return lines


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split(line: str) -> tuple[str, str]:
    """Properties.load0's split: the key ends at the first unescaped `=`, `:` or whitespace; then whitespace and
    at most one `=` or `:` are skipped."""
    key_end, value_start, has_separator, backslash = len(line), len(line), False, False
    for position, char in enumerate(line):
        if char in "=:" and not backslash:
            key_end, value_start, has_separator = position, position + 1, True
            break
        if char in " \t\f" and not backslash:
            key_end, value_start = position, position + 1
            break
        backslash = not backslash if char == "\\" else False
    while value_start < len(line):
        char = line[value_start]
        if char not in " \t\f":
            if not has_separator and char in "=:":
                has_separator = True
            else:
                break
        value_start += 1
    return line[:key_end], line[value_start:]


_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    position = 0
    while position < len(text):
        char = text[position]
        position += 1
        if char != "\\" or position >= len(text):
            out.append(char if char != "\\" else "")
            continue
        char = text[position]
        position += 1
        if char == "u":
            digits = text[position : position + 4]
            if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError("malformed \\uXXXX escape")
            out.append(chr(int(digits, 16)))
            position += 4
        else:
            out.append(_ESCAPES.get(char, char))
    return "".join(out)


# --- sasl.jaas.config ---------------------------------------------------------------------------------------------


class JaasEntry(BaseModel):
    """One JAAS login module entry: `<module> <flag> key="value" …;`."""

    model_config = ConfigDict(frozen=True)

    module: str
    flag: str
    options: dict[str, str] = Field(repr=False)


def parse_jaas(text: str) -> JaasEntry:
    """The single login module entry of a `sasl.jaas.config`, read as Kafka's JaasConfig reads it (a
    StreamTokenizer: words, `"…"` or `'…'` quoted values with backslash escapes, `//` and `/* */` comments).
    Raises ValueError with a reason that holds no part of the text (it carries a password)."""
    tokens = _jaas_tokens(text)
    entries: list[JaasEntry] = []
    position = 0
    while position < len(tokens):
        kind, module = tokens[position]
        if kind != "word":
            raise ValueError("must start with a LoginModule class name")
        if position + 1 >= len(tokens) or tokens[position + 1][0] != "word":
            raise ValueError("the LoginModule's control flag (required) is missing")
        flag = tokens[position + 1][1].lower()
        if flag not in ("required", "requisite", "sufficient", "optional"):
            raise ValueError("the control flag must be required, requisite, sufficient or optional")
        position += 2
        options: dict[str, str] = {}
        while position < len(tokens) and tokens[position] != ("char", ";"):
            kind, key = tokens[position]
            if (
                kind != "word"
                or position + 2 >= len(tokens)
                or tokens[position + 1] != ("char", "=")
                or tokens[position + 2][0] not in ("word", "quoted")
            ):
                raise ValueError('options must be key="value" pairs')
            options[key] = tokens[position + 2][1]
            position += 3
        if position >= len(tokens):
            raise ValueError("the entry must end with a semicolon")
        position += 1
        entries.append(JaasEntry(module=module, flag=flag, options=options))
    if len(entries) != 1:
        raise ValueError(f"must hold exactly one LoginModule entry ({len(entries)} found)")
    return entries[0]


_WORD_START = re.compile(r"[A-Za-z_$\-\u00a0-\u00ff]")
_WORD_CHAR = re.compile(r"[A-Za-z0-9_$.\-\u00a0-\u00ff]")
_QUOTED_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _jaas_tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        char = text[position]
        if char <= " ":
            position += 1
        elif text.startswith("//", position):
            end = text.find("\n", position)
            position = len(text) if end < 0 else end
        elif text.startswith("/*", position):
            end = text.find("*/", position + 2)
            position = len(text) if end < 0 else end + 2
        elif char in "\"'":
            value, position = _quoted(text, position + 1, char)
            tokens.append(("quoted", value))
        elif _WORD_START.match(char):
            start = position
            while position < len(text) and _WORD_CHAR.match(text[position]):
                position += 1
            tokens.append(("word", text[start:position]))
        elif char in "=;":
            tokens.append(("char", char))
            position += 1
        else:
            raise ValueError("holds a character outside a quoted value that JAAS does not allow (quote the values)")
    return tokens


def _quoted(text: str, position: int, quote: str) -> tuple[str, int]:
    """A quoted value from `position` (after the quote) as StreamTokenizer reads it; it ends at the closing quote
    or at the end of the line."""
    out: list[str] = []
    while position < len(text) and text[position] not in (quote, "\n", "\r"):
        char = text[position]
        position += 1
        if char != "\\" or position >= len(text):
            out.append(char)
            continue
        char = text[position]
        position += 1
        if char in "01234567":
            digits = char
            limit = 3 if char <= "3" else 2
            while len(digits) < limit and position < len(text) and text[position] in "01234567":
                digits += text[position]
                position += 1
            out.append(chr(int(digits, 8)))
        else:
            out.append(_QUOTED_ESCAPES.get(char, char))
    if position < len(text) and text[position] == quote:
        position += 1
    return "".join(out), position


# --- reading the settings -----------------------------------------------------------------------------------------


def _error(name: str, reason: str, properties_file: str | None) -> SecuritySettingError:
    if name.startswith("KAFKA_"):
        return SecuritySettingError("environment", name, reason)
    return SecuritySettingError(f"Kafka client properties ({properties_file})", name, reason)


def _shown(value: str) -> str:
    """A short enumerated value (a mechanism, a store type) as it may appear in an error; anything else is not
    shown (it could be a secret put under the wrong key)."""
    return repr(value) if _SHOWN_VALUE.fullmatch(value) else "this value"


def read_properties_file(path: str) -> dict[str, str]:
    """The properties of the file `KAFKA_CLIENT_PROPERTIES` names (UTF-8, or ISO-8859-1 as Java reads it)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise _error(PROPERTIES_VARIABLE, "no such file", None) from None
    except OSError as exc:
        raise _error(PROPERTIES_VARIABLE, f"cannot be read ({type(exc).__name__})", None) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("iso-8859-1")
    try:
        return parse_properties(text)
    except ValueError as exc:  # "line N: …": the line, never its text
        line, _, reason = str(exc).partition(": ")
        raise SecuritySettingError(f"Kafka client properties ({path})", line, reason) from None


def properties_bootstrap(environ: Mapping[str, str]) -> str | None:
    """The `bootstrap.servers` of the file KAFKA_CLIENT_PROPERTIES names, or None (no variable, no key, or a file
    that cannot be read: reading the security settings reports that, naming the variable)."""
    path = (environ.get(PROPERTIES_VARIABLE) or "").strip()
    if not path:
        return None
    try:
        value = read_properties_file(path).get("bootstrap.servers", "")
    except SecuritySettingError:
        return None
    return value or None


class _Settings:
    """The settings being assembled: each value with the key or variable it came from."""

    def __init__(self, properties: Mapping[str, str], environ: Mapping[str, str], properties_file: str | None) -> None:
        self.properties = properties
        self.environ = environ
        self.properties_file = properties_file
        self.names: dict[str, str] = {}

    def error(self, name: str, reason: str) -> SecuritySettingError:
        return _error(name, reason, self.properties_file)

    def env(self, name: str) -> str | None:
        value = self.environ.get(name)
        return value.strip() if value is not None and value.strip() else None

    def key(self, *names: str) -> tuple[str, str] | None:
        """The first of `names` (a Java key and its librdkafka twin) the file sets to something (an empty value is
        the default, as for a Java client); both set differently: error."""
        given = [(name, self.properties[name]) for name in names if self.properties.get(name)]
        if len({value for _, value in given}) > 1:
            raise self.error(given[0][0], f"is also given as {given[1][0]} with another value: keep one")
        return given[0] if given else None

    def pick(self, field: str, variable: str, *keys: str) -> str | None:
        """The variable's value when set, else the file's key; remembers which one it was for `field`."""
        value = self.env(variable)
        if value is not None:
            self.names[field] = variable
            return value
        found = self.key(*keys) if keys else None
        if found is None:
            return None
        self.names[field] = found[0]
        return found[1]

    def secret(self, field: str, variable: str, file_variable: str) -> str | None:
        """A password from its variable or from the file its _FILE variable names (one trailing newline dropped)."""
        direct, path = self.env(variable), self.env(file_variable)
        if direct is not None and path is not None:
            raise self.error(file_variable, f"give the password once: {variable} or {file_variable}")
        if direct is not None:
            self.names[field] = variable
            return direct
        if path is None:
            return None
        self.names[field] = file_variable
        try:
            value = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise self.error(file_variable, "no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise self.error(file_variable, f"cannot be read as UTF-8 text ({type(exc).__name__})") from None
        value = value.removesuffix("\n").removesuffix("\r")
        if not value:
            raise self.error(file_variable, "the file is empty")
        return value

    def existing_file(self, field: str, value: str | None) -> Path | None:
        if value is None:
            return None
        path = Path(value)
        if not path.is_file():
            raise self.error(self.names[field], "no such file")
        return path


def read_security(environ: Mapping[str, str]) -> KafkaSecurity:
    """The security settings from KAFKA_CLIENT_PROPERTIES and the KAFKA_* variables on top (blank = unset).

    Raises SecuritySettingError naming the key or variable of the first problem; reads the properties file, a
    password file and the PEM files named (to check that they hold what they should)."""
    path = (environ.get(PROPERTIES_VARIABLE) or "").strip() or None
    properties = read_properties_file(path) if path else {}
    settings = _Settings(properties, environ, path)
    ignored = _check_keys(settings)  # unsupported settings first: they are refused whatever else is wrong
    _store_type(settings, "ssl.truststore.type", "ssl.truststore.location")
    _store_type(settings, "ssl.keystore.type", "ssl.keystore.location")
    check_hostname = _check_hostname(settings)
    versions = _tls_versions(settings)

    protocol_value = settings.pick("protocol", "KAFKA_SECURITY_PROTOCOL", "security.protocol")
    protocol = _protocol(settings, protocol_value)
    sasl = _sasl(settings, protocol)
    tls = _tls(settings, protocol, check_hostname, versions)
    return KafkaSecurity(
        protocol=protocol,
        **sasl,
        **tls,
        bootstrap=properties.get("bootstrap.servers") or None,
        ignored=tuple(sorted(ignored)),
        names=settings.names,
        properties_file=path,
    )


def _check_keys(settings: _Settings) -> list[str]:
    """Refuse the security keys the router does not support (by name); return the other keys it ignores."""
    ignored = []
    for key, value in settings.properties.items():
        if key in SUPPORTED_KEYS:
            continue
        if key in DEFAULT_ONLY:
            if value and value != DEFAULT_ONLY[key]:
                raise settings.error(key, f"only the Java client's default ({DEFAULT_ONLY[key]}) is supported")
            continue
        if key.startswith(("ssl.", "sasl.", "security.")):
            if not value:
                continue  # an empty setting is the Java client's default too
            hint = REFUSAL_HINTS.get(key, "is a security setting the router does not support")
            raise settings.error(key, hint)
        ignored.append(key)
    return ignored


def _protocol(settings: _Settings, value: str | None) -> Protocol:
    if value is None:
        return "PLAINTEXT"
    upper = value.upper()
    if upper not in PROTOCOLS:
        raise settings.error(settings.names["protocol"], f"{_shown(value)} is not one of {', '.join(PROTOCOLS)}")
    return upper


def _sasl(settings: _Settings, protocol: Protocol) -> dict[str, object]:
    """mechanism, username and password; an error when SASL is set up for a protocol that does not use it."""
    mechanism_value = settings.pick("mechanism", "KAFKA_SASL_MECHANISM", "sasl.mechanism", "sasl.mechanisms")
    jaas_value = settings.pick("jaas", "", "sasl.jaas.config")
    entry = _jaas_entry(settings, jaas_value) if jaas_value else None
    rd_username = settings.key("sasl.username")
    rd_password = settings.key("sasl.password")
    if entry is not None and (rd_username or rd_password):
        raise settings.error("sasl.username", "give the credentials once: sasl.jaas.config or sasl.username")
    username = settings.pick("username", "KAFKA_SASL_USERNAME", "sasl.username")
    if username is None and entry is not None and "username" in entry.options:
        username = entry.options["username"]
        settings.names["username"] = "sasl.jaas.config"
    password = settings.secret("password", "KAFKA_SASL_PASSWORD", "KAFKA_SASL_PASSWORD_FILE")
    if password is None and rd_password is not None:
        password = rd_password[1]
        settings.names["password"] = "sasl.password"
    if password is None and entry is not None and "password" in entry.options:
        password = entry.options["password"]
        settings.names["password"] = "sasl.jaas.config"

    mechanism = _mechanism(settings, mechanism_value, entry)
    given = [name for name in ("mechanism", "jaas", "username", "password") if name in settings.names]
    if protocol not in ("SASL_PLAINTEXT", "SASL_SSL"):
        if given:
            named = settings.names[given[0]]
            raise settings.error(
                _protocol_name(settings),
                f"is {protocol}, which uses no SASL, but {named} is set: use SASL_SSL (or SASL_PLAINTEXT)",
            )
        return {}
    if not username or not password:
        missing = "username" if not username else "password"
        other = settings.names.get("password" if missing == "username" else "username", "")
        from_env = other.startswith("KAFKA_") or settings.properties_file is None
        name = (
            ("KAFKA_SASL_USERNAME" if missing == "username" else "KAFKA_SASL_PASSWORD")
            if from_env
            else "sasl.jaas.config"
        )
        raise settings.error(
            name,
            f"{protocol} needs a {missing}: sasl.jaas.config "
            '(`… required username="…" password="…";`) or KAFKA_SASL_USERNAME with KAFKA_SASL_PASSWORD(_FILE)',
        )
    return {"mechanism": mechanism, "username": username, "password": password}


def _protocol_name(settings: _Settings) -> str:
    """Where the protocol came from, or where to set it when it was left unset (PLAINTEXT)."""
    unset = "security.protocol" if settings.properties_file else "KAFKA_SECURITY_PROTOCOL"
    return settings.names.get("protocol", unset)


def _jaas_entry(settings: _Settings, text: str) -> JaasEntry:
    try:
        entry = parse_jaas(text)
    except ValueError as exc:
        raise settings.error("sasl.jaas.config", str(exc)) from None
    if entry.module not in (PLAIN_MODULE, SCRAM_MODULE):
        shown = entry.module if _LOGIN_MODULE.fullmatch(entry.module) else "this LoginModule"
        raise settings.error(
            "sasl.jaas.config", f"{shown} is not supported (PlainLoginModule or ScramLoginModule only)"
        )
    if entry.flag != "required":
        raise settings.error("sasl.jaas.config", "the LoginModule's control flag must be required")
    unknown = set(entry.options) - {"username", "password"}
    if unknown:
        raise settings.error(
            "sasl.jaas.config",
            f"{len(unknown)} option(s) besides username and password (e.g. tokenauth) are not supported",
        )
    return entry


def _mechanism(settings: _Settings, value: str | None, entry: JaasEntry | None) -> Mechanism:
    """The mechanism asked for, or the one the LoginModule implies (PLAIN for PlainLoginModule; SCRAM needs it
    named, SHA-256 or SHA-512)."""
    if value is not None:
        upper = value.upper()
        if upper not in MECHANISMS:
            raise settings.error(
                settings.names["mechanism"], f"{_shown(value)} is not supported (only {', '.join(MECHANISMS)})"
            )
        mechanism = upper
        if entry is not None and (entry.module == PLAIN_MODULE) != (mechanism == "PLAIN"):
            wanted = "PlainLoginModule" if mechanism == "PLAIN" else "ScramLoginModule"
            raise settings.error("sasl.jaas.config", f"sasl.mechanism {mechanism} needs the {wanted}")
        return mechanism
    if entry is not None and entry.module == SCRAM_MODULE:
        raise settings.error("sasl.mechanism", "must be SCRAM-SHA-256 or SCRAM-SHA-512 with the ScramLoginModule")
    return "PLAIN"


def _tls(
    settings: _Settings, protocol: Protocol, check_hostname: bool, versions: tuple[TlsVersion, ...]
) -> dict[str, object]:
    """CA file, client certificate and key, hostname check and TLS versions; files must exist and hold PEM."""
    ca = settings.pick("ca_file", "KAFKA_SSL_CA_LOCATION", "ssl.truststore.location", "ssl.ca.location")
    cert = settings.pick("cert_file", "KAFKA_SSL_CERT_LOCATION", "ssl.keystore.location", "ssl.certificate.location")
    key = settings.pick("key_file", "KAFKA_SSL_KEY_LOCATION", "ssl.key.location")
    key_password = settings.secret("key_password", "KAFKA_SSL_KEY_PASSWORD", "KAFKA_SSL_KEY_PASSWORD_FILE")
    if key_password is None and "ssl.key.password" in settings.properties:
        key_password = settings.properties["ssl.key.password"] or None
        if key_password is not None:
            settings.names["key_password"] = "ssl.key.password"
    given = [field for field in ("ca_file", "cert_file", "key_file", "key_password") if field in settings.names]
    if protocol not in ("SSL", "SASL_SSL"):
        if given:
            raise settings.error(
                _protocol_name(settings),
                f"is {protocol}, which uses no TLS, but {settings.names[given[0]]} is set: use SSL or SASL_SSL",
            )
        return {}
    if key is not None and cert is None:
        raise settings.error(settings.names["key_file"], "names a private key but no client certificate is given")
    if key_password is not None and cert is None:
        raise settings.error(settings.names["key_password"], "is set but no client certificate and key are given")
    ca_file = settings.existing_file("ca_file", ca)
    cert_file = settings.existing_file("cert_file", cert)
    key_file = settings.existing_file("key_file", key)
    _check_pem(settings, "ca_file", ca_file, needs_key=False)
    _check_pem(settings, "cert_file", cert_file, needs_key=key_file is None)
    if key_file is not None:
        _check_pem_key(settings, key_file)
    return {
        "ca_file": ca_file,
        "cert_file": cert_file,
        "key_file": key_file,
        "key_password": key_password,
        "check_hostname": check_hostname,
        "tls_versions": versions,
    }


def _store_type(settings: _Settings, type_key: str, location_key: str) -> None:
    """PEM only; a location without a type is a JKS store to a Java client, so it is refused too."""
    kind = settings.properties.get(type_key, "")
    if kind and kind.upper() != "PEM":
        raise settings.error(
            type_key, f"{_shown(kind)} is not supported: only PEM (convert the store, e.g. with keytool and openssl)"
        )
    if settings.properties.get(location_key) and not kind:
        raise settings.error(
            type_key,
            f"is unset, which means JKS to a Java client: the router reads PEM files only (set {type_key}=PEM)",
        )


def _check_pem(settings: _Settings, field: str, path: Path | None, *, needs_key: bool) -> None:
    if path is None:
        return
    text = _read_pem(settings, field, path)
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise settings.error(settings.names[field], "holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    if needs_key and not re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", text):
        raise settings.error(
            settings.names[field], "holds no PEM private key beside the certificate (or name the key's own file)"
        )


def _check_pem_key(settings: _Settings, path: Path) -> None:
    if not re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", _read_pem(settings, "key_file", path)):
        raise settings.error(settings.names["key_file"], "holds no PEM private key")


def _read_pem(settings: _Settings, field: str, path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise settings.error(settings.names[field], f"cannot be read ({type(exc).__name__})") from None


def _check_hostname(settings: _Settings) -> bool:
    variable = settings.env("KAFKA_SSL_CHECK_HOSTNAME")
    if variable is not None:
        lowered = variable.lower()
        if lowered not in ("true", "false", "1", "0", "yes", "no"):
            raise settings.error("KAFKA_SSL_CHECK_HOSTNAME", "must be true or false")
        return lowered in ("true", "1", "yes")
    key = "ssl.endpoint.identification.algorithm"
    if key not in settings.properties:
        return True
    value = settings.properties[key].lower()
    if value not in ("https", "", "none"):
        raise settings.error(key, "must be https (hostname verification, the default) or empty (none)")
    return value == "https"


def _tls_versions(settings: _Settings) -> tuple[TlsVersion, ...]:
    """ssl.enabled.protocols narrows TLS 1.2/1.3; ssl.protocol (Java's SSLContext name) is only checked: OpenSSL
    negotiates the highest version both sides allow."""
    chosen = settings.properties.get("ssl.protocol", "")
    if chosen and chosen not in ("TLS", *TLS_VERSIONS):
        raise settings.error("ssl.protocol", f"{_shown(chosen)} is not supported (TLSv1.2 or TLSv1.3)")
    enabled = settings.properties.get("ssl.enabled.protocols", "")
    if not enabled:
        return TLS_VERSIONS
    names = [name.strip() for name in enabled.split(",") if name.strip()]
    refused = [name for name in names if name not in TLS_VERSIONS]
    if refused or not names:
        raise settings.error("ssl.enabled.protocols", "only TLSv1.2 and TLSv1.3 are supported")
    return tuple(version for version in TLS_VERSIONS if version in names)
