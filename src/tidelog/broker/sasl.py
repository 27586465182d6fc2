"""SASL authentication on SASL_PLAINTEXT and SASL_SSL listeners: SaslHandshake (v1) + SaslAuthenticate (v0-2),
the KIP-152 flow every current client uses.

A connection on a SASL listener starts unauthenticated and may send only ApiVersions, SaslHandshake and
SaslAuthenticate; anything else closes it (Kafka's "Unexpected Kafka request ... during SASL handshake"), and
until it is authenticated a frame may not exceed `sasl.server.max.receive.size`. The handshake names a
mechanism of `sasl.enabled.mechanisms` (else UNSUPPORTED_SASL_MECHANISM, and the connection is closed); then:
- PLAIN: one SaslAuthenticate with `authzid NUL username NUL password`; the password is checked against the
  user's stored SCRAM credential (PBKDF2 in a worker thread), so no password is stored anywhere;
- SCRAM-SHA-256/512: two round trips (scram.py).
Success makes the connection `User:<username>`. A failure answers SASL_AUTHENTICATION_FAILED after
`connection.failed.authentication.delay.ms` (slows password guessing) and closes the connection. Requests out
of order answer ILLEGAL_SASL_STATE. Connections on other listeners are authenticated from the start:
`User:ANONYMOUS`, or the client certificate's DN on an SSL listener with client authentication (tls.py).
The legacy flow (SaslHandshake v0 followed by raw tokens) is not offered: SaslHandshake is advertised from v1.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any

from tidelog.broker import scram
from tidelog.broker.config import Listener, SecurityConfig
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.broker.security_store import UserStore
from tidelog.broker.tls import ANONYMOUS, certificate_principal
from tidelog.errors import ErrorCode, SaslAuthenticationError
from tidelog.protocol.messages import ApiKey

log = logging.getLogger("tidelog.security")


PRE_AUTHENTICATION_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
PLAIN = "PLAIN"
PLAIN_FAILED = "Authentication failed: Invalid username or password"


class SaslState(Enum):
    HANDSHAKE = "handshake"  # waiting for SaslHandshake (ApiVersions allowed)
    AUTHENTICATE = "authenticate"  # mechanism chosen, SaslAuthenticate rounds
    COMPLETE = "complete"
    FAILED = "failed"


@dataclass
class SaslSession:
    state: SaslState = SaslState.HANDSHAKE
    mechanism: str | None = None
    scram: scram.ScramServer | None = None


def open_session(connection: Connection, ssl_object: Any) -> None:
    """Set a new connection's principal: unauthenticated on a SASL listener, else ANONYMOUS or the cert's DN."""
    if connection.listener.sasl:
        connection.authenticated = False
        connection.sasl = SaslSession()
    elif connection.listener.tls:
        connection.principal = certificate_principal(ssl_object)
    else:
        connection.principal = ANONYMOUS


def parse_plain(auth_bytes: bytes) -> tuple[str, str, str]:
    """RFC 4616: `authzid NUL authcid NUL passwd` -> (authzid, username, password)."""
    try:
        parts = auth_bytes.decode("utf-8").split("\x00")
    except UnicodeDecodeError:
        raise SaslAuthenticationError("Invalid SASL/PLAIN response: not UTF-8") from None
    if len(parts) != 3:
        raise SaslAuthenticationError(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}")
    authzid, username, password = parts
    if not username or not password:
        raise SaslAuthenticationError("Authentication failed: username or password not specified")
    if authzid and authzid != username:
        raise SaslAuthenticationError(
            "Authentication failed: Client requested an authorization id that is different from username"
        )
    return authzid, username, password


class SaslApis:
    """SaslHandshake and SaslAuthenticate (PLAIN, SCRAM) against the users file in `log_dir`."""

    def __init__(self, config: SecurityConfig, listeners: Sequence[Listener], log_dir: Path) -> None:
        self.config = config
        self.mechanisms = list(self.config.sasl_enabled_mechanisms)
        self._log_dir = log_dir
        if any(listener.sasl for listener in listeners):
            _ = self.users  # a users file that does not parse stops the start, naming the file

    @cached_property
    def users(self) -> UserStore:
        return UserStore(self._log_dir)

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.SASL_HANDSHAKE: ApiHandler(1, 1, self.handle_handshake),
            ApiKey.SASL_AUTHENTICATE: ApiHandler(0, 2, self.handle_authenticate),
        }

    async def handle_handshake(self, request: Any, connection: Connection) -> Response:
        session = connection.sasl
        answer: dict[str, Any] = {"error_code": 0, "mechanisms": self.mechanisms}
        if session is None or session.state is not SaslState.HANDSHAKE:
            answer["error_code"] = ErrorCode.ILLEGAL_SASL_STATE
            if session is not None and session.state is not SaslState.COMPLETE:
                self._fail(connection, session, "a second SaslHandshake during authentication")
            return answer
        mechanism = request.body.mechanism
        if mechanism not in self.mechanisms:
            answer["error_code"] = ErrorCode.UNSUPPORTED_SASL_MECHANISM
            self._fail(connection, session, f"mechanism {mechanism!r} is not in sasl.enabled.mechanisms")
            return answer
        session.mechanism = mechanism
        session.state = SaslState.AUTHENTICATE
        if mechanism != PLAIN:
            session.scram = scram.ScramServer(mechanism, lambda user: self.users.credential(user, mechanism))
        return answer

    async def handle_authenticate(self, request: Any, connection: Connection) -> Response:
        session = connection.sasl
        answer: dict[str, Any] = {"error_code": 0, "error_message": None, "auth_bytes": b"", "session_lifetime": 0}
        if session is None or session.state is SaslState.COMPLETE:
            answer.update(
                error_code=ErrorCode.ILLEGAL_SASL_STATE,
                error_message="SaslAuthenticate request received after successful authentication",
            )
            return answer
        if session.state is not SaslState.AUTHENTICATE:
            answer.update(
                error_code=ErrorCode.ILLEGAL_SASL_STATE,
                error_message="SaslAuthenticate request received before a SaslHandshake",
            )
            self._fail(connection, session, "SaslAuthenticate before SaslHandshake")
            return answer
        auth_bytes = bytes(request.body.auth_bytes)
        try:
            if session.scram is None:
                username = await self._authenticate_plain(auth_bytes)
            elif not session.scram.awaiting_final:
                answer["auth_bytes"] = session.scram.first(auth_bytes)
                return answer
            else:
                answer["auth_bytes"] = session.scram.final(auth_bytes)
                username = session.scram.username or ""
        except SaslAuthenticationError as exc:
            self._fail(connection, session, str(exc))
            await asyncio.sleep(self.config.failed_authentication_delay_ms / 1000)
            answer.update(error_code=exc.kafka_error_code, error_message=str(exc), auth_bytes=b"")
            return answer
        session.state = SaslState.COMPLETE
        connection.principal = f"User:{username}"
        connection.authenticated = True
        log.info("%s authenticated as %s (SASL/%s)", connection.peer, connection.principal, session.mechanism)
        return answer

    async def _authenticate_plain(self, auth_bytes: bytes) -> str:
        _, username, password = parse_plain(auth_bytes)
        found = self.users.any_credential(username)
        mechanism, credential = found if found is not None else _decoy()
        ok = await asyncio.to_thread(scram.verify_password, mechanism, credential, password)
        if not ok or found is None:
            raise SaslAuthenticationError(PLAIN_FAILED)
        return username

    def _fail(self, connection: Connection, session: SaslSession, reason: str) -> None:
        session.state = SaslState.FAILED
        connection.closing = True
        log.info("authentication of %s failed: %s", connection.peer, reason)


_DECOY: tuple[str, scram.ScramCredential] | None = None


def _decoy() -> tuple[str, scram.ScramCredential]:
    """A credential no password matches: an unknown PLAIN user costs the same PBKDF2 as a known one."""
    global _DECOY
    if _DECOY is None:
        _DECOY = ("SCRAM-SHA-256", scram.make_credential("SCRAM-SHA-256", "decoy", salt=b"\x00" * 32))
    return _DECOY
