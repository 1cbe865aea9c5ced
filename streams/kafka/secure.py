"""`chatwoot-router kafka --secure`: the same KRaft nodes, secured as a managed cluster is (issue 31).

Listeners of each node, both on 127.0.0.1:

- `SASL_SSL` (the client port, the only advertised listener): TLS with the data dir's node certificate
  (`streams.kafka.tls`) and SASL SCRAM-SHA-512. Clients and the brokers' replication both use it; the brokers
  authenticate as `admin`.
- `CONTROLLER` (the controller port, never advertised): TLS with client certificates required, so only a holder of
  the node key in the data dir gets in (as `User:CN=chatwoot-router-kafka-node`). It is not PLAINTEXT because the
  controller authorizes its callers too: a plaintext caller is `User:ANONYMOUS`, which would have to be a super
  user, and since KIP-919 any client may send admin requests (CreateAcls among them) to a controller. Not SCRAM
  because KRaft controllers cannot read SCRAM credentials, which live in the metadata they serve.

The StandardAuthorizer refuses what no ACL allows (`allow.everyone.if.no.acl.found=false`); `admin` and the nodes
are the super users. One SCRAM user per role of the running router (`projections.acls.SERVICE_ROLES`) is
made when the storage is formatted (`--add-scram`), with a random password drawn at first start and kept in
`<data-dir>/secrets/passwords.json` (0600, directory 0700); the storage tool reads it from an argument file of
the same mode, never from its command line, so no password shows in a process list or in the launcher's output.
`<data-dir>/clients/` holds one Java client properties file per role (0600) and `ca.pem`, rewritten at each start.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handlers.kafka import acl_admin
from projections.acls import SERVICE_ROLES, Acl, Role, acls_for
from streams.kafka.tls import LOCAL_HOSTS, NODE_PRINCIPAL, TlsFiles, ensure_certificates

MECHANISM = "SCRAM-SHA-512"
CLIENT_LISTENER = "SASL_SSL"
CONTROLLER_LISTENER = "CONTROLLER"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
PROPERTIES_FILES = {role: f"{role.value}.properties" for role in SERVICE_ROLES}
_PASSWORDS = Path("secrets") / "passwords.json"


class SecureSetupError(RuntimeError):
    """The data dir's secured setup cannot be used; the message says why, never a password."""


@dataclass(frozen=True)
class SecureSetup:
    """One data dir's certificates and SCRAM users (a cluster's three nodes share them)."""

    root: Path
    tls: TlsFiles
    passwords: Mapping[Role, str] = field(repr=False)

    @property
    def properties_dir(self) -> Path:
        """Where `<role>.properties` and `ca.pem` are: what the ready line names."""
        return self.root / "clients"

    def principal(self, role: Role) -> str:
        return f"User:{role.value}"

    def role_acls(self, app_id: str) -> list[Acl]:
        """The ACLs of every role user but `admin` (a super user) for `app_id`."""
        return acls_for(app_id, {role: self.principal(role) for role in SERVICE_ROLES if role is not Role.ADMIN})

    def server_settings(self, port: int, controller_port: int, advertised_port: int | None = None) -> dict[str, str]:
        """What a node's server.properties says, on top of the plaintext node's, to serve as described above."""
        admin = self.passwords[Role.ADMIN]
        return {
            "listeners": f"{CLIENT_LISTENER}://127.0.0.1:{port},{CONTROLLER_LISTENER}://127.0.0.1:{controller_port}",
            "advertised.listeners": f"{CLIENT_LISTENER}://127.0.0.1:{advertised_port or port}",
            "inter.broker.listener.name": CLIENT_LISTENER,
            "listener.security.protocol.map": f"{CONTROLLER_LISTENER}:SSL,{CLIENT_LISTENER}:SASL_SSL",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.{CLIENT_LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config": _jaas("admin", admin),
            f"listener.name.{CLIENT_LISTENER.lower()}.ssl.client.auth": "none",
            f"listener.name.{CONTROLLER_LISTENER.lower()}.ssl.client.auth": "required",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.tls.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.tls.ca),
            "ssl.endpoint.identification.algorithm": "https",
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"{self.principal(Role.ADMIN)};{NODE_PRINCIPAL}",
        }

    def scram_argument_file(self) -> Path:
        """A java @argument file with the storage tool's `--add-scram` options for every role (mode 0600)."""
        lines: list[str] = []
        for role in SERVICE_ROLES:
            lines += ["--add-scram", f"{MECHANISM}=[name={role.value},password={self.passwords[role]}]"]
        path = self.root / "secrets" / "add-scram.args"
        _write_private(path, "\n".join(lines) + "\n")
        return path

    def client_options(self, role: Role, *, cafile: Path | None = None) -> dict[str, Any]:
        """aiokafka keyword arguments for a client of `role` (what a properties file of `role` says)."""
        context = ssl.create_default_context(cafile=str(cafile or self.tls.ca))  # hostname checked, CERT_REQUIRED
        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": MECHANISM,
            "sasl_plain_username": role.value,
            "sasl_plain_password": self.passwords[role],
            "ssl_context": context,
        }

    def write_client_files(self) -> Path:
        """`ca.pem` and one properties file per role in `properties_dir`; returns that directory."""
        directory = _private_dir(self.properties_dir)
        ca = directory / "ca.pem"
        shutil.copyfile(self.tls.ca, ca)
        for role, name in PROPERTIES_FILES.items():
            _write_private(directory / name, client_properties(role, self.passwords[role], ca.resolve()))
        return directory


def client_properties(role: Role, password: str, ca: Path) -> str:
    """A standard Java client properties file for `role` (usable as KAFKA_CLIENT_PROPERTIES or `--command-config`)."""
    return "\n".join(
        [
            f"# chatwoot-router kafka --secure: the {role.value} role's client settings",
            "security.protocol=SASL_SSL",
            f"sasl.mechanism={MECHANISM}",
            f"sasl.jaas.config={_jaas(role.value, password)}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={ca}",
            "ssl.endpoint.identification.algorithm=https",
            "",
        ]
    )


def _jaas(username: str, password: str) -> str:
    login = "org.apache.kafka.common.security.scram.ScramLoginModule"
    return f'{login} required username="{username}" password="{password}";'


def prepare(root: Path, hosts: Sequence[str] = LOCAL_HOSTS, *, add_roles: bool = True) -> SecureSetup:
    """The secured setup of the data dir `root`: passwords and certificates made on first use, kept after; the node
    certificate names `hosts` (`streams.kafka.tls`). A role added since the passwords were made gets one when
    `add_roles` (its user is made from it: `kafka-users` of the compose file); else that is a SecureSetupError (a
    storage formatted then has no user for it)."""
    root = root.resolve()
    passwords = _passwords(root / _PASSWORDS, add_roles=add_roles)
    setup = SecureSetup(root, ensure_certificates(root / "tls", hosts=hosts), passwords)
    setup.write_client_files()
    return setup


def is_secured(root: Path) -> bool:
    """Whether `root` was started with `--secure` (its SCRAM users exist only in such a data dir's storage)."""
    return (root / _PASSWORDS).exists()


def _passwords(path: Path, *, add_roles: bool) -> dict[Role, str]:
    kept: dict[Role, str] = {}
    if path.exists():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            kept = {role: saved[role.value] for role in SERVICE_ROLES if role.value in saved}
            if Role.ADMIN not in kept or not all(isinstance(password, str) for password in kept.values()):
                raise ValueError
        except (ValueError, TypeError, AttributeError):
            raise SecureSetupError(f"{path} is not the passwords file this tool writes: use a new --data-dir") from None
    missing = [role.value for role in SERVICE_ROLES if role not in kept]
    if not missing:
        return kept
    if kept and not add_roles:
        raise SecureSetupError(
            f"{path.parent} was made before the role {', '.join(missing)} existed (its storage has no SCRAM user for "
            "it): use a new --data-dir"
        )
    # [A-Za-z0-9_-]: nothing to quote anywhere
    made = kept | {role: secrets.token_urlsafe(24) for role in SERVICE_ROLES if role not in kept}
    _private_dir(path.parent)
    _write_private(path, json.dumps({role.value: password for role, password in made.items()}, indent=2) + "\n")
    return made


def _private_dir(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    return directory


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only, replacing the file whole."""
    staging = path.with_name(path.name + ".tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    staging.replace(path)


def apply_settings(properties: str, overrides: Mapping[str, str]) -> str:
    """`properties` (key=value lines) with each key of `overrides` set: replaced in place, else appended."""
    pending = dict(overrides)
    lines: list[str] = []
    for line in properties.splitlines():
        key = line.partition("=")[0].strip()
        lines.append(f"{key}={pending.pop(key)}" if key in pending else line)
    while lines and not lines[-1]:
        lines.pop()
    lines += [f"{key}={value}" for key, value in pending.items()]
    return "\n".join([*lines, ""])


def write_server_properties(path: Path, text: str) -> None:
    """server.properties of a secured node holds the admin password (inter-broker SCRAM): owner only."""
    _write_private(path, text)


def grant_roles(setup: SecureSetup, bootstrap: str, app_id: str, timeout: float = 60.0) -> None:
    """Create the role users' ACLs for `app_id` as `admin` and wait until every broker enforces them (from
    synchronous code; async code awaits `acl_admin.grant` itself)."""
    try:
        asyncio.run(acl_admin.grant(bootstrap, setup.client_options(Role.ADMIN), setup.role_acls(app_id), timeout))
    except Exception as exc:  # one line for the command, whatever failed (no password is in any of these)
        raise SecureSetupError(f"creating the roles' ACLs for {app_id!r} failed: {type(exc).__name__}: {exc}") from None
