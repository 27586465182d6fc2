"""Helpers of the security tests: throw-away TLS certificates (`openssl` CLI), SCRAM users added with the real
`tidelog users` command, the secured broker's settings, and confluent-kafka / kafka-python settings for a
listener, mechanism and user.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_process import BrokerProcess, tidelog_command

LISTENERS = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SUPER_USER = "admin"
PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA certificate clients trust
    server_keystore: Path  # PEM: the server's private key and certificate (ssl.keystore.location)
    other_ca: Path  # a CA that did not sign the server certificate


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip


def make_certificates(directory: Path) -> Certificates:
    """A CA, a server certificate it signs for localhost and 127.0.0.1, and an unrelated second CA."""
    _make_ca(directory, "tidelog-test-ca")
    _make_ca(directory, "other-ca")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost",
        cwd=directory,
    )  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "tidelog-test-ca.pem", "-CAkey", "tidelog-test-ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", "san.cnf", "-out", "server.crt",
        cwd=directory,
    )  # fmt: skip
    keystore = directory / "server-keystore.pem"
    keystore.write_text((directory / "server.key").read_text() + (directory / "server.crt").read_text())
    return Certificates(directory / "tidelog-test-ca.pem", keystore, directory / "other-ca.pem")


def make_client_certificate(certificates: Certificates, common_name: str) -> tuple[Path, Path]:
    """(certificate, key) PEM files of a client certificate for `/O=tidelog/CN=<common_name>` signed by the CA."""
    directory = certificates.ca.parent
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{common_name}.key", "-out", f"{common_name}.csr",
        "-subj", f"/O=tidelog/CN={common_name}",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{common_name}.csr", "-CA", "tidelog-test-ca.pem", "-CAkey", "tidelog-test-ca.key",
        "-CAcreateserial", "-days", "2", "-out", f"{common_name}.crt",
        cwd=directory,
    )  # fmt: skip
    return directory / f"{common_name}.crt", directory / f"{common_name}.key"


def tidelog(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the real `tidelog` command line."""
    result = subprocess.run([*tidelog_command(), *args], capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, f"tidelog {' '.join(args)} failed: {result.stderr}"
    return result


def add_users(log_dir: Path, passwords: dict[str, str] = PASSWORDS) -> None:
    for user, password in passwords.items():
        tidelog("users", "--log-dir", str(log_dir), "--add", user, "--password", password)


def secure_settings(certificates: Certificates, **extra: Any) -> dict[str, Any]:
    return {
        "sasl.enabled.mechanisms": ",".join(MECHANISMS),
        "ssl.keystore.location": str(certificates.server_keystore),
        "authorizer.class.name": AUTHORIZER,
        "super.users": f"User:{SUPER_USER}",
        "connection.failed.authentication.delay.ms": 10,
        **extra,
    }


# --- client settings ------------------------------------------------------------------------------------------


def confluent_config(
    broker: BrokerProcess,
    listener: str,
    certificates: Certificates,
    mechanism: str | None = None,
    user: str | None = None,
    password: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """librdkafka settings for one listener: security.protocol, sasl.*, ssl.ca.location."""
    config: dict[str, Any] = {"bootstrap.servers": broker.bootstrap_for(listener), "security.protocol": listener}
    if mechanism is not None:
        assert user is not None
        config.update(
            {
                "sasl.mechanisms": mechanism,
                "sasl.username": user,
                "sasl.password": PASSWORDS[user] if password is None else password,
            }
        )
    if "SSL" in listener:
        config["ssl.ca.location"] = str(certificates.ca)
    return {**config, **extra}


def kafka_python_config(
    broker: BrokerProcess,
    listener: str,
    certificates: Certificates,
    mechanism: str | None = None,
    user: str | None = None,
    password: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """kafka-python settings for one listener."""
    config: dict[str, Any] = {"bootstrap_servers": broker.bootstrap_for(listener), "security_protocol": listener}
    if mechanism is not None:
        assert user is not None
        config.update(
            sasl_mechanism=mechanism,
            sasl_plain_username=user,
            sasl_plain_password=PASSWORDS[user] if password is None else password,
        )
    if "SSL" in listener:
        config.update(ssl_cafile=str(certificates.ca), ssl_check_hostname=True)
    return {**config, **extra}
