"""SCRAM-SHA-256/512 (tidelog.broker.scram): the RFC 7677 test vector, round trips, and every way to fail."""

from __future__ import annotations

import base64

import pytest

from tidelog.broker import scram
from tidelog.broker.sasl import parse_plain
from tidelog.errors import SaslAuthenticationError

# RFC 7677 section 3: user "user", password "pencil".
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_credential() -> scram.ScramCredential:
    return scram.make_credential("SCRAM-SHA-256", "pencil", salt=RFC_SALT, iterations=4096)


def test_rfc7677_client_messages() -> None:
    client = scram.ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)


def test_rfc7677_server_messages() -> None:
    server = scram.ScramServer("SCRAM-SHA-256", {"user": rfc_credential()}.get, server_nonce=RFC_SERVER_NONCE)
    assert server.first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert server.username is None and not server.complete
    assert server.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.complete and server.username == "user"


def test_stored_credential_holds_no_password() -> None:
    credential = rfc_credential()
    stored = str(credential.to_json())
    assert "pencil" not in stored
    assert scram.ScramCredential.from_json(credential.to_json()) == credential
    assert set(credential.to_json()) == {"salt", "stored_key", "server_key", "iterations"}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_round_trip_and_wrong_password(mechanism: str) -> None:
    credential = scram.make_credential(mechanism, "s3cret, with = signs", iterations=4096)
    assert len(credential.salt) == scram.SALT_BYTES
    assert len(credential.stored_key) == (32 if mechanism.endswith("256") else 64)

    client = scram.ScramClient(mechanism, "alice,=x", "s3cret, with = signs")
    server = scram.ScramServer(mechanism, {"alice,=x": credential}.get)
    client.verify(server.final(client.final(server.first(client.first()))))
    assert server.username == "alice,=x"

    intruder = scram.ScramClient(mechanism, "alice,=x", "guess")
    server = scram.ScramServer(mechanism, {"alice,=x": credential}.get)
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        server.final(intruder.final(server.first(intruder.first())))
    assert not server.complete and server.username is None


def test_unknown_user_fails_at_client_first() -> None:
    server = scram.ScramServer("SCRAM-SHA-256", {}.get)
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        server.first(b"n,,n=nobody,r=abc")


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"n,,r=abc",  # no username
        b"n,,n=user",  # no nonce
        b"p=tls-unique,,n=user,r=abc",  # channel binding
        b"x,,n=user,r=abc",  # bad gs2 flag
        b"n,,m=ext,n=user,r=abc",  # reserved mandatory extension
        b"n,a=other,n=user,r=abc",  # authzid differs
        b"n,,n=us=er,r=abc",  # '=' not escaped
        b"n,,n=user,r=a,b",  # nonce attribute followed by a malformed attribute
        b"n,,n=user,r=abc,tokenauth=true",  # delegation tokens
        b"\xff\xfe",
    ],
)
def test_malformed_client_first(message: bytes) -> None:
    server = scram.ScramServer("SCRAM-SHA-256", {"user": rfc_credential()}.get)
    with pytest.raises(SaslAuthenticationError):
        server.first(message)


@pytest.mark.parametrize(
    "final",
    [
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",  # no proof
        b"c=eSws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        b"c=biws,r=rOprNGfwEbeRWgbNEkqOXXX,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",  # other nonce
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA",  # short proof
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=not*base64",
    ],
)
def test_bad_client_final(final: bytes) -> None:
    server = scram.ScramServer("SCRAM-SHA-256", {"user": rfc_credential()}.get, server_nonce=RFC_SERVER_NONCE)
    server.first(RFC_CLIENT_FIRST)
    with pytest.raises(SaslAuthenticationError):
        server.final(final)
    assert not server.complete


def test_messages_out_of_order() -> None:
    server = scram.ScramServer("SCRAM-SHA-256", {"user": rfc_credential()}.get, server_nonce=RFC_SERVER_NONCE)
    with pytest.raises(SaslAuthenticationError):
        server.final(RFC_CLIENT_FINAL)
    server.first(RFC_CLIENT_FIRST)
    with pytest.raises(SaslAuthenticationError):
        server.first(RFC_CLIENT_FIRST)
    server.final(RFC_CLIENT_FINAL)
    with pytest.raises(SaslAuthenticationError):
        server.final(RFC_CLIENT_FINAL)  # a replay after success


def test_iterations_range_and_empty_password() -> None:
    with pytest.raises(ValueError, match="iterations"):
        scram.make_credential("SCRAM-SHA-256", "pw", iterations=4095)
    with pytest.raises(ValueError, match="iterations"):
        scram.make_credential("SCRAM-SHA-512", "pw", iterations=16385)
    with pytest.raises(ValueError, match="empty"):
        scram.make_credential("SCRAM-SHA-256", "")
    with pytest.raises(ValueError, match="SCRAM mechanism"):
        scram.make_credential("SCRAM-SHA-1", "pw")


def test_verify_password_for_plain() -> None:
    credential = scram.make_credential("SCRAM-SHA-512", "right", iterations=4096)
    assert scram.verify_password("SCRAM-SHA-512", credential, "right")
    assert not scram.verify_password("SCRAM-SHA-512", credential, "wrong")
    assert not scram.verify_password("SCRAM-SHA-512", credential, "")


def test_saslname_escaping() -> None:
    assert scram.encode_saslname("a,b=c") == "a=2Cb=3Dc"
    assert scram.decode_saslname("a=2Cb=3Dc") == "a,b=c"
    with pytest.raises(SaslAuthenticationError):
        scram.decode_saslname("a=2Db")


def test_parse_plain() -> None:
    assert parse_plain(b"\x00alice\x00pw") == ("", "alice", "pw")
    assert parse_plain(b"alice\x00alice\x00pw") == ("alice", "alice", "pw")
    for bad in (b"alice\x00pw", b"\x00\x00pw", b"\x00alice\x00", b"bob\x00alice\x00pw", b"\xff\x00a\x00b"):
        with pytest.raises(SaslAuthenticationError):
            parse_plain(bad)
