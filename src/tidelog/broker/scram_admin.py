"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51): the protocol twin of `tidelog users`, over
the same store (security_store.UserStore, `tidelog-users.json` in the first log dir), as Kafka 3.9 answers them
(KIP-554).

Contract:

- Describe needs DESCRIBE on the cluster (else the whole answer is CLUSTER_AUTHORIZATION_FAILED). No users (null or
  empty): every user with a credential, sorted, each with its mechanisms (1 SCRAM-SHA-256, 2 SCRAM-SHA-512) and
  iterations. Named users, once each in request order: an empty name or a user without credentials is
  RESOURCE_NOT_FOUND, a name given twice DUPLICATE_RESOURCE.
- Alter needs ALTER on the cluster (else every user named is CLUSTER_AUTHORIZATION_FAILED). Each user is judged
  whole, its other changes failing with it: an empty name is UNACCEPTABLE_CREDENTIAL, an unknown mechanism
  UNSUPPORTED_SASL_MECHANISM, iterations outside 4096..16384 UNACCEPTABLE_CREDENTIAL ("Too few/many iterations"), a
  (user, mechanism) named twice DUPLICATE_RESOURCE, deleting a credential the user does not have RESOURCE_NOT_FOUND.
  An upsertion carries the salt and the SaltedPassword the client computed (never the password): the broker keeps
  StoredKey and ServerKey from it, as `tidelog users --add` does. Every accepted change is written in one atomic
  replacement of the file (on the admin thread: it fsyncs); a running broker's SCRAM and PLAIN logins use it at once.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from tidelog.broker.acl import Operation, ResourceType
from tidelog.broker.handler import ApiHandler, Connection, HandlerTable, Response
from tidelog.broker.scram import MAX_ITERATIONS, MIN_ITERATIONS, ScramCredential, credential_from_salted
from tidelog.errors import ErrorCode
from tidelog.protocol.messages import ApiKey, Request

if TYPE_CHECKING:
    from tidelog.broker.admin import AdminExecutor
    from tidelog.broker.authorizer import Authorizer
    from tidelog.broker.security_store import UserStore

log = logging.getLogger("tidelog.security")

# ScramMechanism's protocol types
MECHANISM_TYPES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
TYPE_OF = {name: number for number, name in MECHANISM_TYPES.items()}


class ScramCredentialApis:
    def __init__(self, users: UserStore, authorizer: Authorizer, admin: AdminExecutor) -> None:
        self.users = users
        self.authorizer = authorizer
        self.admin = admin

    def handlers(self) -> HandlerTable:
        return {
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: ApiHandler(0, 0, self.handle_describe),
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: ApiHandler(0, 0, self.handle_alter),
        }

    async def handle_describe(self, request: Request, connection: Connection) -> Response:
        answer: dict[str, Any] = {"throttle_time": 0, "error_code": 0, "error_message": None, "results": []}
        if not self.authorizer.authorize(connection, Operation.DESCRIBE, ResourceType.CLUSTER):
            answer["error_code"] = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            return answer
        users = self.users.users()
        named = [u.name for u in request.body.users or ()]
        if not named:
            answer["results"] = [_described(name, users[name]) for name in sorted(users) if users[name]]
            return answer
        counts = Counter(named)
        for name in dict.fromkeys(named):
            if not name:
                answer["results"].append(_failed(name, ErrorCode.RESOURCE_NOT_FOUND, "Username must not be empty"))
            elif counts[name] > 1:
                message = f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}"
                answer["results"].append(_failed(name, ErrorCode.DUPLICATE_RESOURCE, message))
            elif not users.get(name):
                message = f"Attempt to describe a user credential that does not exist: {name}"
                answer["results"].append(_failed(name, ErrorCode.RESOURCE_NOT_FOUND, message))
            else:
                answer["results"].append(_described(name, users[name]))
        return answer

    async def handle_alter(self, request: Request, connection: Connection) -> Response:
        body = request.body
        results: list[dict[str, Any]] = []
        answer = {"throttle_time": 0, "results": results}
        names = list(dict.fromkeys([d.name for d in body.deletions] + [u.name for u in body.upsertions]))
        if not self.authorizer.authorize(connection, Operation.ALTER, ResourceType.CLUSTER):
            results.extend(_altered(name, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None) for name in names)
            return answer
        failed: dict[str, tuple[int, str]] = {}
        for deletion in body.deletions:
            if not deletion.name:
                failed[deletion.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
            elif deletion.mechanism not in MECHANISM_TYPES:
                failed[deletion.name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
        for upsertion in body.upsertions:
            if not upsertion.name:
                failed[upsertion.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
            elif upsertion.mechanism not in MECHANISM_TYPES:
                failed[upsertion.name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
            elif upsertion.iterations < MIN_ITERATIONS:
                failed[upsertion.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
            elif upsertion.iterations > MAX_ITERATIONS:
                failed[upsertion.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations")
        pairs = Counter(
            (change.name, change.mechanism)
            for change in [*body.deletions, *body.upsertions]
            if change.name not in failed
        )
        for (name, _mechanism), count in pairs.items():
            if count > 1:
                message = "A user credential cannot be altered twice in the same request"
                failed[name] = (ErrorCode.DUPLICATE_RESOURCE, message)
        users = self.users.users()
        for deletion in body.deletions:
            if deletion.name not in failed and MECHANISM_TYPES[deletion.mechanism] not in users.get(deletion.name, {}):
                failed[deletion.name] = (
                    ErrorCode.RESOURCE_NOT_FOUND,
                    "Attempt to delete a user credential that does not exist",
                )
        deletions: dict[str, list[str]] = {}
        for deletion in body.deletions:
            if deletion.name not in failed:
                deletions.setdefault(deletion.name, []).append(MECHANISM_TYPES[deletion.mechanism])
        upserts: dict[str, dict[str, ScramCredential]] = {}
        for upsertion in body.upsertions:
            if upsertion.name not in failed:
                mechanism = MECHANISM_TYPES[upsertion.mechanism]
                upserts.setdefault(upsertion.name, {})[mechanism] = credential_from_salted(
                    mechanism, upsertion.salt, upsertion.salted_password, upsertion.iterations
                )
        results.extend(_altered(name, code, message) for name, (code, message) in failed.items())
        accepted = [name for name in names if name not in failed]
        if accepted:
            await self.admin.run(self.users.alter, upserts, deletions)
            log.info(
                "SCRAM credentials altered by %s: set %s, deleted %s",
                connection.principal,
                {u: sorted(c) for u, c in upserts.items()},
                deletions,
            )
        results.extend(_altered(name, ErrorCode.NONE, None) for name in accepted)
        return answer


def _described(name: str, credentials: dict[str, ScramCredential]) -> dict[str, Any]:
    infos = [
        {"mechanism": TYPE_OF[mechanism], "iterations": credential.iterations}
        for mechanism, credential in sorted(credentials.items())
    ]
    return {"user": name, "error_code": 0, "error_message": None, "credential_infos": infos}


def _failed(name: str, code: int, message: str | None) -> dict[str, Any]:
    return {"user": name, "error_code": code, "error_message": message, "credential_infos": []}


def _altered(name: str, code: int, message: str | None) -> dict[str, Any]:
    return {"user": name, "error_code": code, "error_message": message}
