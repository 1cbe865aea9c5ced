"""`chatwoot-router kafka-secrets --out DIR --hosts kafka,kafka-2,kafka-3`: the certificates, passwords and client
properties of a secured Kafka whose nodes run elsewhere (the apache/kafka containers of docker-compose.secure.yml),
made as `chatwoot-router kafka --secure` makes its own (`streams.kafka.secure.prepare`, `streams.kafka.tls`) and
kept: run again, it reuses the CA and the passwords (a node certificate is made again when the hosts change).

DIR, mounted at the same path in every container (the properties files name it), then holds:

- `tls/`: the CA and the certificate every node presents (`node-keystore.pem`: key and chain, PEM), its SANs the
  hosts and localhost (a node's own health check);
- `clients/<role>.properties` and `clients/ca.pem`: one Java client properties file per role, for
  `KAFKA_CLIENT_PROPERTIES`;
- `node-client.properties`: a client holding the node certificate (mutual TLS, the super user
  `User:CN=chatwoot-router-kafka-node`) for the nodes' own listener, and `scram/<user>.properties`
  (`SCRAM-SHA-512=password=…`): what `kafka-configs --bootstrap-server <node>:9094 --add-config-file` needs to
  create the SCRAM users. The image formats its storage itself, without `--add-scram`, and the Admin API cannot
  create SCRAM users through the controllers' listener (Kafka 4.1), so the users are made through the brokers once
  they run, over a listener a password does not open;
- `secrets/passwords.json`: the passwords, drawn at the first run.

A file with a password or a key is mode 0600, its directory 0700. Only the directory is printed, never a password.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from projections.acls import SERVICE_ROLES
from streams.kafka.secure import MECHANISM, SecureSetup, SecureSetupError, _private_dir, _write_private, prepare
from streams.kafka.tls import LOCAL_HOSTS

EXIT_FAILED = 1
EXIT_INVALID = 2
NODE_CLIENT = "node-client.properties"
SCRAM_DIR = "scram"
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|[0-9a-fA-F:.]+")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="the directory to write (kept between runs)")
    parser.add_argument(
        "--hosts",
        required=True,
        help="the nodes' host names or addresses, comma-separated, e.g. kafka,kafka-2,kafka-3 (localhost is added)",
    )


def write_secrets(out: Path, hosts: Sequence[str]) -> SecureSetup:
    """Everything the module's docstring lists, under `out`."""
    setup = prepare(out, [*hosts, *(host for host in LOCAL_HOSTS if host not in hosts)])
    root = setup.root
    _write_private(root / NODE_CLIENT, node_client_properties(setup))
    scram = _private_dir(root / SCRAM_DIR)
    for role in SERVICE_ROLES:
        _write_private(scram / f"{role.value}.properties", f"{MECHANISM}=password={setup.passwords[role]}\n")
    return setup


def node_client_properties(setup: SecureSetup) -> str:
    """A client with the node certificate, for the nodes' mutual-TLS listeners (a super user: for setting up only)."""
    return "\n".join(
        [
            "# chatwoot-router kafka-secrets: the nodes' own listeners, mutual TLS with the node certificate",
            "security.protocol=SSL",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={setup.tls.keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={setup.tls.ca}",
            "ssl.endpoint.identification.algorithm=https",
            "",
        ]
    )


def run(args: argparse.Namespace) -> int:
    hosts = [host.strip() for host in args.hosts.split(",") if host.strip()]
    invalid = [host for host in hosts if not _HOST.fullmatch(host)]
    if not hosts or invalid:
        named = ", ".join(invalid) if invalid else repr(args.hosts)
        print(f"chatwoot-router kafka-secrets: --hosts: not host names or addresses: {named}", file=sys.stderr)
        return EXIT_INVALID
    try:
        setup = write_secrets(args.out, hosts)
    except (SecureSetupError, ValueError, OSError) as exc:  # one line; no password is in any of these
        print(f"chatwoot-router kafka-secrets: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"kafka secrets in {setup.root}: properties={setup.properties_dir}", flush=True)
    return 0
