"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka uses them, sans-I/O: messages in, messages out.

A stored credential is what Kafka keeps for a SCRAM user, never the password:

    SaltedPassword = PBKDF2-HMAC-H(password, salt, iterations)
    StoredKey      = H(HMAC(SaltedPassword, "Client Key"))
    ServerKey      = HMAC(SaltedPassword, "Server Key")

The exchange is two SaslAuthenticate round trips:

    client-first  n,,n=<user>,r=<client nonce>[,<extensions>]
    server-first  r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>
    client-final  c=biws,r=<nonce>,p=<base64 ClientProof>
    server-final  v=<base64 ServerSignature>

The server checks the proof with StoredKey alone: ClientKey = ClientProof XOR HMAC(StoredKey, AuthMessage) and
H(ClientKey) must equal StoredKey. `verify_password` lets SASL/PLAIN check a password against the same stored
credential. `ScramClient` is the other side, for tests and tools. Failures raise SaslAuthenticationError.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog.errors import SaslAuthenticationError

MIN_ITERATIONS = 4096  # Kafka's ScramMechanism.minIterations
MAX_ITERATIONS = 16384  # Kafka's ScramMechanism.maxIterations
DEFAULT_ITERATIONS = 4096
SALT_BYTES = 32
GS2_HEADER = "n,,"  # no channel binding, no authorization id


@dataclass(frozen=True)
class ScramMechanism:
    name: str  # "SCRAM-SHA-256"
    hash_name: str  # hashlib's name: "sha256"

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode("utf-8"), salt, iterations)


MECHANISMS: dict[str, ScramMechanism] = {
    "SCRAM-SHA-256": ScramMechanism("SCRAM-SHA-256", "sha256"),
    "SCRAM-SHA-512": ScramMechanism("SCRAM-SHA-512", "sha512"),
}


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_json(self) -> dict[str, Any]:
        return {
            "salt": _b64(self.salt),
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
            "iterations": self.iterations,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScramCredential:
        return cls(
            base64.b64decode(data["salt"], validate=True),
            base64.b64decode(data["stored_key"], validate=True),
            base64.b64decode(data["server_key"], validate=True),
            int(data["iterations"]),
        )


def mechanism(name: str) -> ScramMechanism:
    try:
        return MECHANISMS[name]
    except KeyError:
        raise ValueError(f"{name!r} is not a SCRAM mechanism (one of {', '.join(MECHANISMS)})") from None


def make_credential(
    mechanism_name: str, password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    """The stored form of `password` for one mechanism; a fresh random salt unless one is given (tests)."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, not {iterations}")
    if not password:
        raise ValueError("the password is empty")
    scram = mechanism(mechanism_name)
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    return credential_from_salted(mechanism_name, salt, scram.salted_password(password, salt, iterations), iterations)


def credential_from_salted(
    mechanism_name: str, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    """The stored form from a SaltedPassword the client computed (AlterUserScramCredentials sends that, never the
    password; Kafka's ScramFormatter.generateCredential)."""
    scram = mechanism(mechanism_name)
    client_key = scram.hmac(salted_password, b"Client Key")
    return ScramCredential(salt, scram.hash(client_key), scram.hmac(salted_password, b"Server Key"), iterations)


def verify_password(mechanism_name: str, credential: ScramCredential, password: str) -> bool:
    """True if `password` is the one `credential` was made from (PBKDF2 again: ~ms; call it off the event loop)."""
    scram = mechanism(mechanism_name)
    salted = scram.salted_password(password, credential.salt, credential.iterations)
    return hmac.compare_digest(scram.hash(scram.hmac(salted, b"Client Key")), credential.stored_key)


# --- message syntax ------------------------------------------------------------------------------------------


def encode_saslname(username: str) -> str:
    return username.replace("=", "=3D").replace(",", "=2C")


def decode_saslname(saslname: str) -> str:
    """RFC 5802: ',' and '=' travel as '=2C' and '=3D'; any other '=' is malformed."""
    rest = saslname.replace("=2C", "").replace("=3D", "")
    if "=" in rest:
        raise SaslAuthenticationError(f"invalid username encoding in {saslname!r}")
    return saslname.replace("=2C", ",").replace("=3D", "=")


def _attributes(message: str, what: str) -> list[tuple[str, str]]:
    """`a=1,b=2` -> [("a", "1"), ("b", "2")]; each attribute is one letter or an extension name."""
    pairs = []
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise SaslAuthenticationError(f"malformed SCRAM {what}: {message!r}")
        pairs.append((key, value))
    return pairs


def _valid_nonce(nonce: str) -> bool:
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise SaslAuthenticationError(f"{what} is not valid base64") from None


@dataclass(frozen=True)
class ClientFirst:
    gs2_header: str
    bare: str  # client-first-message-bare, part of the AuthMessage
    username: str
    nonce: str
    extensions: dict[str, str]


def parse_client_first(message: str) -> ClientFirst:
    """gs2-header client-first-message-bare; no channel binding ('p=' is refused), authzid must be the user."""
    flag, sep1, rest = message.partition(",")
    authzid, sep2, bare = rest.partition(",")
    if not (sep1 and sep2):
        raise SaslAuthenticationError(f"malformed SCRAM client-first message: {message!r}")
    if flag.startswith("p="):
        raise SaslAuthenticationError("SCRAM channel binding is not supported")
    if flag not in ("n", "y"):
        raise SaslAuthenticationError(f"invalid SCRAM gs2 channel-binding flag {flag!r}")
    attributes = _attributes(bare, "client-first message")
    if len(attributes) < 2 or attributes[0][0] != "n" or attributes[1][0] != "r":
        raise SaslAuthenticationError(f"SCRAM client-first message must start with n= and r=: {message!r}")
    username = decode_saslname(attributes[0][1])
    nonce = attributes[1][1]
    if not username or not _valid_nonce(nonce):
        raise SaslAuthenticationError("SCRAM client-first message has an empty username or an invalid nonce")
    if authzid and (not authzid.startswith("a=") or decode_saslname(authzid[2:]) != username):
        raise SaslAuthenticationError("SCRAM authorization id differs from the username")
    return ClientFirst(f"{flag},{authzid},", bare, username, nonce, dict(attributes[2:]))


# --- the server side -------------------------------------------------------------------------------------------

CredentialLookup = Callable[[str], ScramCredential | None]


class ScramServer:
    """One SCRAM exchange on the server: `first(client_first)` -> server-first, `final(client_final)` ->
    server-final; `username` is authenticated once `final` returns. Any failure raises SaslAuthenticationError."""

    def __init__(self, mechanism_name: str, lookup: CredentialLookup, *, server_nonce: str | None = None) -> None:
        self.mechanism = mechanism(mechanism_name)
        self._lookup = lookup
        self._server_nonce = server_nonce or secrets.token_urlsafe(24)
        self._client_first: ClientFirst | None = None
        self._server_first = ""
        self._credential: ScramCredential | None = None
        self.username: str | None = None
        self.complete = False

    @property
    def awaiting_final(self) -> bool:
        """True once server-first has been sent: the next client message is client-final."""
        return self._client_first is not None

    def first(self, client_first: bytes) -> bytes:
        if self._client_first is not None:
            raise SaslAuthenticationError("unexpected second SCRAM client-first message")
        parsed = parse_client_first(_text(client_first))
        if parsed.extensions.get("tokenauth", "false").lower() == "true":
            raise SaslAuthenticationError("delegation token authentication is not supported")
        credential = self._lookup(parsed.username)
        if credential is None:
            raise SaslAuthenticationError(self.invalid_credentials())
        self._client_first, self._credential = parsed, credential
        self._server_first = f"r={parsed.nonce}{self._server_nonce},s={_b64(credential.salt)},i={credential.iterations}"
        return self._server_first.encode("ascii")

    def final(self, client_final: bytes) -> bytes:
        if self._client_first is None or self._credential is None or self.complete:
            raise SaslAuthenticationError("unexpected SCRAM client-final message")
        message = _text(client_final)
        without_proof, sep, proof_attribute = message.rpartition(",")
        attributes = _attributes(without_proof, "client-final message") if sep else []
        if len(attributes) < 2 or attributes[0][0] != "c" or attributes[1][0] != "r":
            raise SaslAuthenticationError(f"malformed SCRAM client-final message: {message!r}")
        if not proof_attribute.startswith("p="):
            raise SaslAuthenticationError("SCRAM client-final message has no proof")
        if _unb64(attributes[0][1], "channel binding") != self._client_first.gs2_header.encode("utf-8"):
            raise SaslAuthenticationError("SCRAM channel binding does not match the client-first message")
        if attributes[1][1] != self._client_first.nonce + self._server_nonce:
            raise SaslAuthenticationError("SCRAM nonce does not match")
        auth_message = f"{self._client_first.bare},{self._server_first},{without_proof}".encode()
        scram, credential = self.mechanism, self._credential
        proof = _unb64(proof_attribute[2:], "client proof")
        signature = scram.hmac(credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise SaslAuthenticationError(self.invalid_credentials())
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(scram.hash(client_key), credential.stored_key):
            raise SaslAuthenticationError(self.invalid_credentials())
        self.username = self._client_first.username
        self.complete = True
        return f"v={_b64(scram.hmac(credential.server_key, auth_message))}".encode("ascii")

    def invalid_credentials(self) -> str:
        return (
            "Authentication failed during authentication due to invalid credentials with SASL mechanism "
            f"{self.mechanism.name}"
        )


def _text(message: bytes) -> str:
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationError("SCRAM message is not UTF-8") from None


# --- the client side (tests and tools) ----------------------------------------------------------------------------


class ScramClient:
    """The client's half of the exchange: `first()`, `final(server_first)`, `verify(server_final)`."""

    def __init__(self, mechanism_name: str, username: str, password: str, *, nonce: str | None = None) -> None:
        self.mechanism = mechanism(mechanism_name)
        self.username = username
        self.password = password
        self.nonce = nonce or secrets.token_urlsafe(24)
        self._bare = f"n={encode_saslname(username)},r={self.nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return (GS2_HEADER + self._bare).encode("utf-8")

    def final(self, server_first: bytes) -> bytes:
        server_first_text = server_first.decode("utf-8")
        attributes = dict(_attributes(server_first_text, "server-first message"))
        nonce, salt, iterations = attributes["r"], _unb64(attributes["s"], "salt"), int(attributes["i"])
        if not nonce.startswith(self.nonce) or iterations < MIN_ITERATIONS:
            raise SaslAuthenticationError("the server's SCRAM nonce or iteration count is not acceptable")
        scram = self.mechanism
        salted = scram.salted_password(self.password, salt, iterations)
        client_key = scram.hmac(salted, b"Client Key")
        without_proof = f"c={_b64(GS2_HEADER.encode())},r={nonce}"
        auth_message = f"{self._bare},{server_first_text},{without_proof}".encode()
        signature = scram.hmac(scram.hash(client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = scram.hmac(scram.hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify(self, server_final: bytes) -> None:
        attributes = dict(_attributes(server_final.decode("utf-8"), "server-final message"))
        if "e" in attributes:
            raise SaslAuthenticationError(f"the server refused: {attributes['e']}")
        if not hmac.compare_digest(_unb64(attributes.get("v", ""), "server signature"), self._server_signature):
            raise SaslAuthenticationError("the server's SCRAM signature is wrong")
