"""Security keys of server.properties: listeners and `listener.security.protocol.map`, SASL, TLS and the
authorizer; every bad value is a ConfigError naming its key, and no key means no security (as before)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.broker.config import BrokerConfig
from tidelog.broker.tls import server_context
from tidelog.errors import ConfigError


def test_without_security_keys_nothing_changes() -> None:
    config = BrokerConfig.from_mapping({"listeners": "PLAINTEXT://127.0.0.1:9092"})
    (listener,) = config.listeners
    assert (listener.protocol, listener.tls, listener.sasl) == ("PLAINTEXT", False, False)
    assert not config.security.acls_enabled


def test_each_protocol_name_maps_to_itself_and_the_map_names_others() -> None:
    config = BrokerConfig.from_mapping(
        {
            "listeners": "SASL_PLAINTEXT://:9092,CLIENT://:9093,INTERNAL://:9094",
            "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT",
            "ssl.keystore.location": "/etc/tidelog/server.pem",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:admin;User:CN=ops,O=acme",
        }
    )
    protocols = {listener.name: (listener.protocol, listener.tls, listener.sasl) for listener in config.listeners}
    assert protocols == {
        "SASL_PLAINTEXT": ("SASL_PLAINTEXT", False, True),
        "CLIENT": ("SASL_SSL", True, True),
        "INTERNAL": ("SSL", True, False),
    }
    assert config.security.sasl_enabled_mechanisms == ("PLAIN", "SCRAM-SHA-512")
    assert config.security.super_users == {"User:admin", "User:CN=ops,O=acme"}
    assert config.security.acls_enabled


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"listeners": "CLIENT://:9092"}, "listeners"),  # a name the map does not know
        ({"listener.security.protocol.map": "CLIENT:TLS"}, "listener.security.protocol.map"),
        ({"listeners": "SSL://:9093"}, "ssl.keystore.location"),  # TLS without a keystore
        ({"ssl.keystore.password": "x"}, "ssl.keystore.password"),  # a PEM store has no password
        ({"sasl.enabled.mechanisms": "GSSAPI"}, "sasl.enabled.mechanisms"),
        ({"authorizer.class.name": "com.example.Authorizer"}, "authorizer.class.name"),
        ({"super.users": "admin"}, "super.users"),
        ({"ssl.client.auth": "sometimes"}, "ssl.client.auth"),
        ({"listeners": "SSL://:9093", "ssl.keystore.location": "k.pem", "ssl.client.auth": "required"},
         "ssl.truststore.location"),
        ({"listeners": "PLAINTEXT://:1,PLAINTEXT://:2"}, "listeners"),
    ],
)  # fmt: skip
def test_bad_security_settings_name_their_key(settings: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        BrokerConfig.from_mapping(settings)


def test_an_unreadable_keystore_is_a_config_error(tmp_path: Path) -> None:
    garbage = tmp_path / "server.pem"
    garbage.write_text("not a PEM file\n")
    for keystore in (tmp_path / "missing.pem", garbage):
        with pytest.raises(ConfigError, match=r"ssl\.keystore\.location"):
            server_context(str(keystore), None, None, "none", ("TLSv1.2", "TLSv1.3"))
