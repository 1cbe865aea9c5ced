"""Client security in one place (issue 31 item 1): the properties file and the variables on top
(`schemas/kafka_security.py`), the client options and Faust credentials made of them, and the one-line reports of
a refused setting, login or certificate (`handlers/kafka/security.py`). No broker: the plaintext path against a
real one is the rest of the suite, whose clients all take these (empty) options."""

from __future__ import annotations

import asyncio
import datetime
import logging
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed, UnsupportedSaslMechanismError

from handlers.kafka import security
from schemas.config import ConfigError, read_env
from schemas.kafka_security import (
    KafkaSecurity,
    SecuritySettingError,
    parse_jaas,
    parse_properties,
    read_security,
)

PASSWORD = "s3cr3t-Pa55word-xyz"
PLAIN_JAAS = (  # exactly as Confluent Cloud's Java client snippet writes it: single quotes
    f"org.apache.kafka.common.security.plain.PlainLoginModule required username='KEY123' password='{PASSWORD}';"
)
CONFLUENT_JAVA = f"""\
# Required connection configs for Kafka producer, consumer, and admin
bootstrap.servers=pkc-abc12.eu-west-1.aws.confluent.cloud:9092
security.protocol=SASL_SSL
sasl.jaas.config={PLAIN_JAAS}
sasl.mechanism=PLAIN
# Required for correctness in Apache Kafka clients prior to 2.6
client.dns.lookup=use_all_dns_ips

# Best practice for higher availability in Apache Kafka clients prior to 3.0
session.timeout.ms=45000

# Best practice for Kafka producer to prevent data loss
acks=all

# Required connection configs for Confluent Cloud Schema Registry
schema.registry.url=https://psrc-xyz.eu-west-1.aws.confluent.cloud
basic.auth.credentials.source=USER_INFO
basic.auth.user.info=SRKEY:{PASSWORD}
"""
CONFLUENT_LIBRDKAFKA = f"""\
bootstrap.servers=pkc-abc12.eu-west-1.aws.confluent.cloud:9092
security.protocol=SASL_SSL
sasl.mechanisms=PLAIN
sasl.username=KEY123
sasl.password={PASSWORD}
session.timeout.ms=45000
"""
MSK_SCRAM = f"""\
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\
    username="router-worker" \\
    password="{PASSWORD}";
"""


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    """Each test reads the environment it sets; none leaves its settings cached for another."""
    security.reset()
    yield
    security.reset()


def write(tmp_path: Path, text: str, name: str = "client.properties") -> dict[str, str]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return {"KAFKA_CLIENT_PROPERTIES": str(path)}


def refused(environ: dict[str, str]) -> str:
    """The one-line error of a refused setting; it never holds the password."""
    with pytest.raises(SecuritySettingError) as caught:
        read_security(environ)
    text = str(caught.value)
    assert PASSWORD not in text and "\n" not in text
    return text


# --- java.util.Properties -----------------------------------------------------------------------------------------


def test_properties_syntax_as_java_reads_it() -> None:
    text = (
        "# a comment\n"
        "  ! another comment \\\n"
        "a=1\n"
        "b : 2  \n"
        "c 3\n"
        "d=first \\\n"
        "      second\n"
        "e\\=x=equals in key\r\n"
        "f=\\u0041\\tB\n"
        "g=ends in two backslashes \\\\\n"
        "h=next\n"
        "a=last wins\n"
        "empty=\n"
        "alone\n"
    )
    assert parse_properties(text) == {
        "a": "last wins",
        "b": "2",
        "c": "3",
        "d": "first second",
        "e=x": "equals in key",
        "f": "A\tB",
        "g": "ends in two backslashes \\",
        "h": "next",
        "empty": "",
        "alone": "",
    }


def test_a_malformed_unicode_escape_names_the_line_not_its_text(tmp_path: Path) -> None:
    text = refused(write(tmp_path, f"security.protocol=SSL\nsasl.password={PASSWORD}\\u12\n"))
    assert "line 2" in text and "malformed" in text


def test_jaas_values_in_either_quotes_with_escapes() -> None:
    entry = parse_jaas(
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="a \\"b\\"" '
        "password='c\\\\d\\101' /* a comment */;"
    )
    assert (entry.module, entry.flag) == ("org.apache.kafka.common.security.plain.PlainLoginModule", "required")
    assert entry.options == {"username": 'a "b"', "password": "c\\dA"}


@pytest.mark.parametrize(
    "jaas",
    [
        f'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="{PASSWORD}"',
        f'org.apache.kafka.common.security.plain.PlainLoginModule username="u" password="{PASSWORD}";',
        f"org.apache.kafka.common.security.plain.PlainLoginModule required username=u password {PASSWORD};",
        f'org.apache.kafka.common.security.plain.PlainLoginModule required password="{PASSWORD}"; x required;',
        f"{PASSWORD}",
    ],
)
def test_a_malformed_jaas_config_is_refused_without_its_text(tmp_path: Path, jaas: str) -> None:
    text = refused(write(tmp_path, f"security.protocol=SASL_SSL\nsasl.jaas.config={jaas}\n"))
    assert "sasl.jaas.config" in text


# --- the snippets clusters hand out -------------------------------------------------------------------------------


def test_confluent_clouds_java_snippet_works_as_it_is(tmp_path: Path) -> None:
    settings = read_security(write(tmp_path, CONFLUENT_JAVA))
    assert (settings.protocol, settings.mechanism, settings.username, settings.password) == (
        "SASL_SSL",
        "PLAIN",
        "KEY123",
        PASSWORD,
    )
    assert settings.ca_file is None and settings.check_hostname  # the system's CAs, hostname verified
    assert settings.bootstrap == "pkc-abc12.eu-west-1.aws.confluent.cloud:9092"
    assert settings.ignored == (
        "acks",
        "basic.auth.credentials.source",
        "basic.auth.user.info",
        "client.dns.lookup",
        "schema.registry.url",
        "session.timeout.ms",
    )
    assert PASSWORD not in repr(settings)


def test_confluent_clouds_librdkafka_snippet_works_too(tmp_path: Path) -> None:
    settings = read_security(write(tmp_path, CONFLUENT_LIBRDKAFKA))
    assert (settings.protocol, settings.mechanism, settings.username, settings.password) == (
        "SASL_SSL",
        "PLAIN",
        "KEY123",
        PASSWORD,
    )
    assert settings.ignored == ("session.timeout.ms",)


def test_msk_scram_with_a_continued_jaas_line(tmp_path: Path) -> None:
    settings = read_security(write(tmp_path, MSK_SCRAM))
    assert (settings.protocol, settings.mechanism, settings.username, settings.password) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "router-worker",
        PASSWORD,
    )
    options = security_options(write(tmp_path, MSK_SCRAM))
    assert options["sasl_mechanism"] == "SCRAM-SHA-512" and options["security_protocol"] == "SASL_SSL"
    assert isinstance(options["ssl_context"], ssl.SSLContext) and options["ssl_context"].check_hostname


def test_the_plain_login_module_implies_plain_and_scram_must_be_named(tmp_path: Path) -> None:
    plain = CONFLUENT_JAVA.replace("sasl.mechanism=PLAIN\n", "")
    assert read_security(write(tmp_path, plain)).mechanism == "PLAIN"
    scram = MSK_SCRAM.replace("sasl.mechanism=SCRAM-SHA-512\n", "")
    assert "sasl.mechanism: must be SCRAM-SHA-256 or SCRAM-SHA-512" in refused(write(tmp_path, scram))
    mixed = MSK_SCRAM.replace("SCRAM-SHA-512", "PLAIN")
    assert "sasl.jaas.config: sasl.mechanism PLAIN needs the PlainLoginModule" in refused(write(tmp_path, mixed))


# --- mTLS with PEM files ------------------------------------------------------------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA, and a client certificate signed by it with its key encrypted by PASSWORD, in one PEM (as Java's PEM
    key store holds them)."""
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key: Any, issuer: str, issuer_key: Any, ca: bool) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = certificate("test-ca", ca_key, "test-ca", ca_key, True)
    client_cert = certificate("User:router", client_key, "test-ca", ca_key, False)
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    encrypted = client_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(PASSWORD.encode())
    )
    (tmp_path / "client.pem").write_bytes(encrypted + client_cert.public_bytes(pem))
    (tmp_path / "cert-only.pem").write_bytes(client_cert.public_bytes(pem))
    return {"ca": tmp_path / "ca.pem", "client": tmp_path / "client.pem", "cert_only": tmp_path / "cert-only.pem"}


def mtls(pki: dict[str, Path], extra: str = "") -> str:
    return (
        "security.protocol=SSL\n"
        f"ssl.truststore.type=PEM\nssl.truststore.location={pki['ca']}\n"
        f"ssl.keystore.type=PEM\nssl.keystore.location={pki['client']}\n"
        f"ssl.key.password={PASSWORD}\n" + extra
    )


def security_options(environ: dict[str, str]) -> dict[str, Any]:
    """`client_options()` as a process with exactly `environ` would make them."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("KAFKA_CLIENT_PROPERTIES", "KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_PASSWORD"):
            patch.delenv(name, raising=False)
        for name, value in environ.items():
            patch.setenv(name, value)
        security.reset()
        try:
            return security.client_options()
        finally:
            security.reset()


def test_mtls_with_a_pem_trust_store_and_key_store(tmp_path: Path, pki: dict[str, Path]) -> None:
    environ = write(tmp_path, mtls(pki))
    settings = read_security(environ)
    assert (settings.protocol, settings.ca_file, settings.cert_file, settings.key_file) == (
        "SSL",
        pki["ca"],
        pki["client"],
        None,
    )
    options = security_options(environ)
    assert set(options) == {"security_protocol", "ssl_context"}
    context = options["ssl_context"]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "test-ca"),),)]


def test_hostname_verification_off_only_when_the_algorithm_is_empty(tmp_path: Path, pki: dict[str, Path]) -> None:
    off = security_options(write(tmp_path, mtls(pki, "ssl.endpoint.identification.algorithm=\n")))["ssl_context"]
    assert not off.check_hostname and off.verify_mode == ssl.CERT_REQUIRED  # the chain is still verified
    on = security_options(write(tmp_path, mtls(pki, "ssl.endpoint.identification.algorithm=HTTPS\n")))
    assert on["ssl_context"].check_hostname
    assert "ssl.endpoint.identification.algorithm" in refused(
        write(tmp_path, mtls(pki, "ssl.endpoint.identification.algorithm=ldaps\n"))
    )
    only_13 = security_options(write(tmp_path, mtls(pki, "ssl.enabled.protocols=TLSv1.3\n")))["ssl_context"]
    assert only_13.minimum_version == ssl.TLSVersion.TLSv1_3


def test_a_wrong_key_password_names_the_key_never_the_password(tmp_path: Path, pki: dict[str, Path]) -> None:
    wrong = mtls(pki).replace(f"ssl.key.password={PASSWORD}", "ssl.key.password=not-it")
    with pytest.raises(ConfigError) as caught:
        security_options(write(tmp_path, wrong))
    assert str(caught.value).startswith(f"Invalid Kafka client properties ({tmp_path}")
    assert ": ssl.key.password: " in str(caught.value) and "not-it" not in str(caught.value)
    without = mtls(pki).replace(f"ssl.key.password={PASSWORD}\n", "")
    with pytest.raises(ConfigError, match=r": ssl\.keystore\.location: the client certificate and key do not load"):
        security_options(write(tmp_path, without))  # an encrypted key and no password: refused, never a prompt


def test_pem_files_are_checked_for_what_they_hold(tmp_path: Path, pki: dict[str, Path]) -> None:
    no_key = mtls(pki).replace(str(pki["client"]), str(pki["cert_only"]))
    assert "ssl.keystore.location: holds no PEM private key" in refused(write(tmp_path, no_key))
    not_pem = mtls(pki).replace(str(pki["ca"]), str(tmp_path / "client.properties"))
    assert "ssl.truststore.location: holds no PEM certificate" in refused(write(tmp_path, not_pem))
    missing = mtls(pki).replace(str(pki["ca"]), str(tmp_path / "gone.pem"))
    assert refused(write(tmp_path, missing)).endswith("ssl.truststore.location: no such file")


def test_the_variables_give_the_same_mtls(tmp_path: Path, pki: dict[str, Path]) -> None:
    password_file = tmp_path / "key-password"
    password_file.write_text(PASSWORD + "\n")
    environ = {
        "KAFKA_SECURITY_PROTOCOL": "ssl",
        "KAFKA_SSL_CA_LOCATION": str(pki["ca"]),
        "KAFKA_SSL_CERT_LOCATION": str(pki["client"]),
        "KAFKA_SSL_KEY_PASSWORD_FILE": str(password_file),
        "KAFKA_SSL_CHECK_HOSTNAME": "false",
    }
    settings = read_security(environ)
    assert (settings.protocol, settings.key_password, settings.check_hostname) == ("SSL", PASSWORD, False)
    assert settings.name_of("cert_file") == "KAFKA_SSL_CERT_LOCATION"


# --- refusals by name ---------------------------------------------------------------------------------------------

REFUSALS = [
    ("sasl.mechanism=GSSAPI\n", "sasl.mechanism: 'GSSAPI' is not supported"),
    ("sasl.mechanism=OAUTHBEARER\n", "sasl.mechanism: 'OAUTHBEARER' is not supported"),
    (f"sasl.mechanism={PASSWORD}@!\n", "sasl.mechanism: this value is not supported"),
    ("ssl.truststore.type=JKS\n", "ssl.truststore.type: 'JKS' is not supported: only PEM"),
    ("ssl.keystore.type=PKCS12\n", "ssl.keystore.type: 'PKCS12' is not supported: only PEM"),
    ("ssl.truststore.location=/etc/kafka/truststore.jks\n", "ssl.truststore.type: is unset, which means JKS"),
    ("sasl.login.callback.handler.class=x.Handler\n", "sasl.login.callback.handler.class: login callback classes"),
    (
        "sasl.client.callback.handler.class=software.amazon.msk.auth.iam.IAMClientCallbackHandler\n",
        "sasl.client.callback.handler.class: client callback classes are Java code (e.g. AWS MSK IAM)",
    ),
    (
        "sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;\n",
        "sasl.jaas.config: com.sun.security.auth.module.Krb5LoginModule is not supported",
    ),
    (
        "sasl.jaas.config=software.amazon.msk.auth.iam.IAMLoginModule required;\n",
        "sasl.jaas.config: software.amazon.msk.auth.iam.IAMLoginModule is not supported",
    ),
    (f"ssl.keystore.password={PASSWORD}\n", "ssl.keystore.password: PEM key stores take no store password"),
    ("sasl.kerberos.service.name=kafka\n", "sasl.kerberos.service.name: is a security setting the router does not"),
    ("ssl.cipher.suites=TLS_AES_256_GCM_SHA384\n", "ssl.cipher.suites: Java cipher suite names are not supported"),
    ("ssl.enabled.protocols=TLSv1.1,TLSv1.2\n", "ssl.enabled.protocols: only TLSv1.2 and TLSv1.3 are supported"),
    ("ssl.trustmanager.algorithm=SunX509\n", "ssl.trustmanager.algorithm: only the Java client's default (PKIX)"),
    ("security.providers=x.Provider\n", "security.providers: is a security setting"),
    ("security.protocol=SASL_SSL_PLUS\n", "security.protocol: 'SASL_SSL_PLUS' is not one of PLAINTEXT"),
]


@pytest.mark.parametrize(("line", "message"), REFUSALS)
def test_unsupported_security_settings_are_refused_by_name(tmp_path: Path, line: str, message: str) -> None:
    text = refused(write(tmp_path, "security.protocol=SASL_SSL\n" + line if "security.protocol" not in line else line))
    assert message in text
    assert text.startswith(f"Invalid Kafka client properties ({tmp_path / 'client.properties'}): ")


def test_default_values_of_java_only_keys_are_accepted(tmp_path: Path) -> None:
    text = CONFLUENT_JAVA + "ssl.trustmanager.algorithm=PKIX\nssl.protocol=TLSv1.3\nssl.keystore.password=\n"
    assert read_security(write(tmp_path, text)).protocol == "SASL_SSL"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"KAFKA_SASL_MECHANISM": "GSSAPI"}, "Invalid environment: KAFKA_SASL_MECHANISM: 'GSSAPI' is not supported"),
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "Invalid environment: KAFKA_SECURITY_PROTOCOL: 'TLS' is not one of"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": PASSWORD},
            "KAFKA_SECURITY_PROTOCOL: is SSL, which uses no SASL, but KAFKA_SASL_USERNAME is set",
        ),
        (
            {"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": PASSWORD},
            "KAFKA_SECURITY_PROTOCOL: is PLAINTEXT, which uses no SASL, but KAFKA_SASL_USERNAME is set",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_USERNAME": "u"},
            "Invalid environment: KAFKA_SASL_PASSWORD: SASL_SSL needs a password",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_PASSWORD": PASSWORD},
            "Invalid environment: KAFKA_SASL_USERNAME: SASL_SSL needs a username",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "PLAINTEXT", "KAFKA_SSL_CA_LOCATION": "/etc/ssl/ca.pem"},
            "KAFKA_SECURITY_PROTOCOL: is PLAINTEXT, which uses no TLS, but KAFKA_SSL_CA_LOCATION is set",
        ),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CA_LOCATION": "/nonexistent/ca.pem"},
            "KAFKA_SSL_CA_LOCATION: no such file",
        ),
        ({"KAFKA_SSL_CHECK_HOSTNAME": "perhaps"}, "KAFKA_SSL_CHECK_HOSTNAME: must be true or false"),
        ({"KAFKA_CLIENT_PROPERTIES": "/nonexistent/client.properties"}, "KAFKA_CLIENT_PROPERTIES: no such file"),
    ],
)
def test_bad_variables_are_named(environ: dict[str, str], message: str) -> None:
    assert message in refused(environ)


def test_no_setting_at_all_is_plaintext_with_no_options() -> None:
    assert read_security({}) == KafkaSecurity()
    assert read_security({"KAFKA_SECURITY_PROTOCOL": "plaintext", "KAFKA_SASL_MECHANISM": " "}).protocol == "PLAINTEXT"
    assert security_options({}) == {}
    assert security_options({"KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"}) == {}


# --- variables on top of the file ---------------------------------------------------------------------------------


def test_variables_win_over_the_file_and_passwords_come_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "sasl-password"
    secret.write_text("from-the-mounted-secret\n")
    environ = {
        **write(tmp_path, MSK_SCRAM),
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "router-ingress",
        "KAFKA_SASL_PASSWORD_FILE": str(secret),
    }
    settings = read_security(environ)
    assert (settings.username, settings.password) == ("router-ingress", "from-the-mounted-secret")
    assert settings.name_of("password") == "KAFKA_SASL_PASSWORD_FILE"


def test_an_administrators_file_without_the_password_takes_it_from_the_environment(tmp_path: Path) -> None:
    without = MSK_SCRAM.replace(f' \\\n    password="{PASSWORD}"', "")
    assert "sasl.jaas.config: SASL_SSL needs a password" in refused(write(tmp_path, without))
    settings = read_security({**write(tmp_path, without), "KAFKA_SASL_PASSWORD": PASSWORD})
    assert (settings.username, settings.password) == ("router-worker", PASSWORD)


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ("", {}, "KAFKA_SASL_PASSWORD_FILE: the file is empty"),
        (PASSWORD, {"KAFKA_SASL_PASSWORD": PASSWORD}, "give the password once"),
        (None, {}, "KAFKA_SASL_PASSWORD_FILE: no such file"),
    ],
)
def test_password_files_that_cannot_be_used(
    tmp_path: Path, content: str | None, extra: dict[str, str], message: str
) -> None:
    secret = tmp_path / "password"
    if content is not None:
        secret.write_text(content)
    environ = {
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_USERNAME": "u",
        "KAFKA_SASL_PASSWORD_FILE": str(secret),
        **extra,
    }
    assert message in refused(environ)


def test_the_files_bootstrap_servers_is_used_unless_the_variable_is_set(tmp_path: Path) -> None:
    environ = write(tmp_path, CONFLUENT_JAVA)
    assert read_env(environ).bootstrap == "pkc-abc12.eu-west-1.aws.confluent.cloud:9092"
    assert read_env({**environ, "KAFKA_BOOTSTRAP_SERVERS": "b1:9092"}).bootstrap == "b1:9092"
    assert read_env(write(tmp_path, "security.protocol=SSL\n")).bootstrap == "localhost:9092"
    with pytest.raises(ConfigError) as caught:
        read_env(write(tmp_path, "bootstrap.servers=a b:x\n"))
    assert str(caught.value).startswith(f"Invalid Kafka client properties ({tmp_path}")
    assert ": bootstrap.servers: must be host:port" in str(caught.value)


# --- the process's options, Faust's credentials and the warning ---------------------------------------------------


def test_options_are_read_once_and_the_ignored_keys_named_in_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KAFKA_CLIENT_PROPERTIES", write(tmp_path, CONFLUENT_JAVA)["KAFKA_CLIENT_PROPERTIES"])
    with caplog.at_level(logging.WARNING, logger="chatwoot_router.kafka"):
        first = security.client_options()
        (tmp_path / "client.properties").unlink()  # read once per process: later clients get the same options
        second = security.client_options()
    assert first == second and first["ssl_context"] is second["ssl_context"]
    assert first["sasl_plain_username"] == "KEY123" and first["sasl_plain_password"] == PASSWORD
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "KAFKA_CLIENT_PROPERTIES: keys the router ignores (no security settings): acks, "
        "basic.auth.credentials.source, basic.auth.user.info, client.dns.lookup, schema.registry.url, "
        "session.timeout.ms"
    ]
    assert PASSWORD not in caplog.text


def test_faust_gets_the_same_security(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from faust.auth import SASLCredentials
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    assert security.faust_credentials() is None  # PLAINTEXT: Faust's default, nothing changes
    monkeypatch.setenv("KAFKA_CLIENT_PROPERTIES", write(tmp_path, MSK_SCRAM)["KAFKA_CLIENT_PROPERTIES"])
    security.reset()
    credentials = security.faust_credentials()
    assert isinstance(credentials, SASLCredentials) and PASSWORD not in repr(credentials)
    # what Faust's aiokafka driver gives its consumer and producer (the producer's client also creates topics)
    assert credentials_to_aiokafka_auth(credentials) == security.client_options()


def test_faust_gets_tls_alone_for_ssl(tmp_path: Path, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    monkeypatch.setenv("KAFKA_CLIENT_PROPERTIES", write(tmp_path, mtls(pki))["KAFKA_CLIENT_PROPERTIES"])
    assert credentials_to_aiokafka_auth(security.faust_credentials()) == security.client_options()


def test_the_rebootstrap_copies_every_security_field_a_client_holds() -> None:
    """handlers/kafka/rebootstrap.py reconnects with the client's own private fields: security included."""
    from handlers.kafka.rebootstrap import CLIENT_ATTRIBUTES

    names = {f"_{name}" for name in ("security_protocol", "ssl_context", "sasl_mechanism", "sasl_plain_password")}
    assert names <= set(CLIENT_ATTRIBUTES) | {"_sasl_plain_username"}


# --- refused logins and certificates ------------------------------------------------------------------------------


def test_a_refused_login_is_one_line_naming_the_broker_and_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_CLIENT_PROPERTIES", write(tmp_path, MSK_SCRAM)["KAFKA_CLIENT_PROPERTIES"])
    refusal = SaslAuthenticationFailed("Authentication failed during authentication due to invalid credentials")
    line = security.describe_auth_failure(refusal, "b-1.msk.example:9096")
    assert line == (
        "authentication against broker b-1.msk.example:9096 failed: SASL SCRAM-SHA-512 as user 'router-worker' "
        "was refused (wrong username or password?)"
    )
    wrapped = KafkaConnectionError("Unable to bootstrap")
    wrapped.__cause__ = UnsupportedSaslMechanismError("Enabled mechanisms are: ['PLAIN']")
    assert "does not accept SASL SCRAM-SHA-512" in (security.describe_auth_failure(wrapped, "b:1") or "")
    assert security.describe_auth_failure(ConnectionRefusedError(), "b:1") is None
    assert security.describe_auth_failure(KafkaConnectionError("Unable to bootstrap"), "b:1") is None


def test_an_untrusted_certificate_is_one_line() -> None:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_message = "unable to get local issuer certificate"
    line = security.describe_auth_failure(error, "kafka-1:9093")
    assert line is not None and line.startswith(
        "TLS verification of broker kafka-1:9093 failed: unable to get local issuer certificate"
    )
    plain_listener = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    plain_listener.reason = "WRONG_VERSION_NUMBER"
    assert "TLS handshake with broker kafka-1:9093 failed (WRONG_VERSION_NUMBER" in (
        security.describe_auth_failure(plain_listener, "kafka-1:9093") or ""
    )
    no_client_cert = ssl.SSLError(1, "tlsv13 alert certificate required")
    no_client_cert.reason = "TLSV13_ALERT_CERTIFICATE_REQUIRED"
    assert "refused this client's certificate" in (security.describe_auth_failure(no_client_cert, "k:1") or "")


async def test_brokers_are_asked_once_each_and_the_first_refusal_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_CLIENT_PROPERTIES", write(tmp_path, MSK_SCRAM)["KAFKA_CLIENT_PROPERTIES"])
    asked: list[tuple[str, int, dict[str, Any]]] = []

    async def connect(host: str, port: int, **options: Any) -> Any:
        asked.append((host, port, options))
        if host == "down":
            raise ConnectionRefusedError()
        raise SaslAuthenticationFailed("invalid credentials")

    answers = await security.ask_brokers("down:9096,up:9096", connect=connect)
    assert list(answers) == ["down:9096", "up:9096"]
    assert {options["sasl_plain_password"] for _, _, options in asked} == {PASSWORD}
    assert {options["security_protocol"] for _, _, options in asked} == {"SASL_SSL"}

    async def refusing(bootstrap: str, **_: Any) -> dict[str, BaseException | None]:
        return {"down:9096": ConnectionRefusedError(), "up:9096": SaslAuthenticationFailed("invalid")}

    monkeypatch.setattr(security, "ask_brokers", refusing)
    line = await security.check_brokers("down:9096,up:9096")
    assert line is not None and line.startswith("authentication against broker up:9096 failed") and PASSWORD not in line


async def test_health_gets_the_reason_from_a_background_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert security.auth_reason("b:9096") is None  # PLAINTEXT: never a check
    monkeypatch.setenv("KAFKA_CLIENT_PROPERTIES", write(tmp_path, MSK_SCRAM)["KAFKA_CLIENT_PROPERTIES"])
    security.reset()
    checks: list[str] = []

    async def check(bootstrap: str, **_: Any) -> str | None:
        checks.append(bootstrap)
        return f"authentication against broker {bootstrap} failed: …"

    monkeypatch.setattr(security, "check_brokers", check)
    assert security.auth_reason("b:9096") is None  # /healthz answers at once; the check runs in the background
    await asyncio.sleep(0)
    assert security.auth_reason("b:9096") == "authentication against broker b:9096 failed: …"
    assert checks == ["b:9096"]  # not again within the interval


def test_commands_refuse_bad_settings_and_refused_logins_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from streams import cli

    monkeypatch.setenv("KAFKA_CLIENT_PROPERTIES", write(tmp_path, "sasl.mechanism=GSSAPI\n")["KAFKA_CLIENT_PROPERTIES"])
    assert cli.main(["topics"]) == 2
    assert capsys.readouterr().err == (
        f"Invalid Kafka client properties ({tmp_path / 'client.properties'}): sasl.mechanism: 'GSSAPI' is not "
        "supported (only PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)\n"
    )

    monkeypatch.setenv("KAFKA_CLIENT_PROPERTIES", write(tmp_path, MSK_SCRAM)["KAFKA_CLIENT_PROPERTIES"])
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "b-1:9096")
    security.reset()

    async def refusing(bootstrap: str, **_: Any) -> str | None:
        return f"authentication against broker {bootstrap} failed: refused"

    monkeypatch.setattr(security, "check_brokers", refusing)
    assert cli.main(["topics"]) == 2
    assert capsys.readouterr().err == "chatwoot-router topics: authentication against broker b-1:9096 failed: refused\n"


async def test_the_doors_healthz_says_why_kafka_refuses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from handlers.ingress import door
    from tests.unit.test_webhook_app import SETTINGS, MemoryWriter

    writer = MemoryWriter()
    writer.fail = KafkaConnectionError("Unable to bootstrap")
    writer.bootstrap = "b-1:9096"  # type: ignore[attr-defined]
    monkeypatch.setattr(door, "auth_reason", lambda bootstrap: f"authentication against broker {bootstrap} failed")
    server = TestServer(door.create_app(settings=lambda: SETTINGS, writer=writer, clock_ms=lambda: 0), port=0)
    await server.start_server()
    try:
        async with ClientSession() as session, session.get(server.make_url("/healthz")) as response:
            assert response.status == 503
            assert await response.json() == {
                "ok": False,
                "kafka": False,
                "kafka_reason": "authentication against broker b-1:9096 failed",
            }
            writer.fail = None
        async with ClientSession() as session, session.get(server.make_url("/healthz")) as response:
            assert (response.status, await response.json()) == (200, {"ok": True, "kafka": True})
    finally:
        await server.close()


async def test_a_reset_at_the_tls_handshake_is_a_plaintext_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def reset(bootstrap: str, **_: Any) -> dict[str, BaseException | None]:
        return {"k:9092": ConnectionResetError()}

    monkeypatch.setattr(security, "ask_brokers", reset)
    assert await security.check_brokers("k:9092") is None  # PLAINTEXT: a reset is the broker's business
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SSL")
    security.reset()
    assert await security.check_brokers("k:9092") == (
        "TLS handshake with broker k:9092 failed: it closed the connection (is it a TLS listener? check "
        "security.protocol)"
    )


def test_empty_values_are_the_defaults(tmp_path: Path) -> None:
    text = "security.protocol=\nsasl.mechanism=\nssl.truststore.location=\nsasl.jaas.config=\n"
    assert read_security(write(tmp_path, text)) == KafkaSecurity(
        properties_file=str(tmp_path / "client.properties"), names={}
    )
