"""SCRAM users and ACLs on disk, in the first log dir, shared by the broker and the `tidelog users|acls` tools.

    tidelog-users.json  {"version": 1, "users": {"alice": {"SCRAM-SHA-256": {"salt": b64, "stored_key": b64,
                                                                          "server_key": b64, "iterations": 4096},
                                                          "SCRAM-SHA-512": {...}}}}     (mode 0600; no passwords)
    tidelog-acls.json   {"version": 1, "acls": [{"resource_type": "TOPIC", "name": "orders", "pattern_type":
                         "LITERAL", "principal": "User:alice", "host": "*", "operation": "READ",
                         "permission": "ALLOW"}, ...]}

Each file is replaced whole (tmp + fsync + rename + directory fsync), so a reader sees the old or the new
version, never a torn one. Changes are read-modify-write under an flock on the log dir, so the CLI and the
broker (CreateAcls/DeleteAcls) can change the same file at once. Readers notice a new version by a stat of
(inode, mtime, size), at most every `check_interval` seconds: `tidelog users`/`tidelog acls` take effect on a
running broker without a restart. A file that does not parse fails loudly at start; later, the broker keeps
the last good version and logs the error (a half-edited file never opens access). A missing file is empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

from tidelog.atomic_files import fsync_directory
from tidelog.broker.acl import AclBinding, AclFilter
from tidelog.broker.scram import MECHANISMS, ScramCredential
from tidelog.errors import SecurityStoreError

log = logging.getLogger("tidelog.security")

USERS_FILE = "tidelog-users.json"
ACLS_FILE = "tidelog-acls.json"
FORMAT_VERSION = 1
DEFAULT_CHECK_INTERVAL_S = 0.1

T = TypeVar("T")
R = TypeVar("R")
Users = dict[str, dict[str, ScramCredential]]
Acls = tuple[AclBinding, ...]


def write_json_atomically(path: Path, data: Any, mode: int) -> None:
    """tmp (created with `mode`) + fsync + rename + directory fsync."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            fd = -1
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        if fd >= 0:
            os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


class JsonFile(Generic[T]):
    """One versioned JSON file, parsed into a value of type T and reloaded when it changes on disk."""

    def __init__(
        self,
        path: Path,
        parse: Callable[[dict[str, Any]], T],
        dump: Callable[[T], dict[str, Any]],
        empty: T,
        *,
        mode: int = 0o644,
        check_interval: float = DEFAULT_CHECK_INTERVAL_S,
    ) -> None:
        self.path = path
        self._parse = parse
        self._dump = dump
        self._empty = empty
        self._mode = mode
        self._check_interval = check_interval
        self._thread_lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0
        self._value = empty
        self._value = self._read_or_raise()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _read_or_raise(self) -> T:
        self._stamp = self._stat()
        if self._stamp is None:
            return self._empty
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
                raise ValueError(f'expected a JSON object with "version": {FORMAT_VERSION}')
            return self._parse(raw)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SecurityStoreError(f"{self.path}: cannot be read: {exc}") from exc

    def current(self) -> T:
        """The latest good version (a cheap stat at most every check_interval seconds)."""
        now = time.monotonic()
        if now < self._next_check:
            return self._value
        self._next_check = now + self._check_interval
        if self._stat() != self._stamp:
            with self._thread_lock:
                try:
                    self._value = self._read_or_raise()
                    log.info("reloaded %s", self.path)
                except SecurityStoreError as exc:
                    log.error("%s; keeping the previous version", exc)
        return self._value

    def modify(self, change: Callable[[T], tuple[T, R]]) -> R:
        """Read the file fresh under the lock, apply `change` (new value, result), write it back."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._thread_lock, _flock(self.path.parent):
            value, result = change(self._read_or_raise())
            write_json_atomically(self.path, {"version": FORMAT_VERSION, **self._dump(value)}, self._mode)
            self._value = value
            self._stamp = self._stat()
            return result


@contextlib.contextmanager
def _flock(directory: Path) -> Iterator[None]:
    """An exclusive flock on the directory itself (no lock file to leave behind; the engine's .lock is another)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


# --- users -------------------------------------------------------------------------------------------------------


def _parse_users(raw: dict[str, Any]) -> Users:
    users: Users = {}
    for name, credentials in raw["users"].items():
        users[str(name)] = {}
        for mechanism, data in credentials.items():
            if mechanism not in MECHANISMS:
                raise ValueError(f"user {name!r}: unknown mechanism {mechanism!r}")
            users[str(name)][mechanism] = ScramCredential.from_json(data)
    return users


def _dump_users(users: Users) -> dict[str, Any]:
    return {"users": {name: {m: c.to_json() for m, c in sorted(creds.items())} for name, creds in users.items()}}


class UserStore:
    """SCRAM credentials by user and mechanism (`tidelog-users.json`)."""

    def __init__(self, log_dir: Path, *, check_interval: float = DEFAULT_CHECK_INTERVAL_S) -> None:
        self.file: JsonFile[Users] = JsonFile(
            log_dir / USERS_FILE, _parse_users, _dump_users, {}, mode=0o600, check_interval=check_interval
        )

    def users(self) -> Users:
        return self.file.current()

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.file.current().get(user, {}).get(mechanism)

    def any_credential(self, user: str) -> tuple[str, ScramCredential] | None:
        """A credential to check a PLAIN password against (SHA-256 first: cheaper)."""
        credentials = self.file.current().get(user, {})
        for mechanism in sorted(credentials):
            return mechanism, credentials[mechanism]
        return None

    def set(self, user: str, credentials: dict[str, ScramCredential]) -> None:
        def change(users: Users) -> tuple[Users, None]:
            updated = {**users, user: {**users.get(user, {}), **credentials}}
            return updated, None

        self.file.modify(change)

    def alter(self, upserts: dict[str, dict[str, ScramCredential]], deletions: dict[str, list[str]]) -> None:
        """Set and remove credentials of several users in one write (AlterUserScramCredentials)."""

        def change(users: Users) -> tuple[Users, None]:
            updated = {name: dict(creds) for name, creds in users.items()}
            for user, mechanisms in deletions.items():
                for mechanism_name in mechanisms:
                    updated.get(user, {}).pop(mechanism_name, None)
            for user, credentials in upserts.items():
                updated.setdefault(user, {}).update(credentials)
            return {name: creds for name, creds in updated.items() if creds}, None

        self.file.modify(change)

    def remove(self, user: str, mechanisms: list[str] | None = None) -> list[str]:
        """Remove the user's credentials for `mechanisms` (all if None); returns the mechanisms removed."""

        def change(users: Users) -> tuple[Users, list[str]]:
            current = dict(users.get(user, {}))
            doomed = sorted(current) if mechanisms is None else [m for m in mechanisms if m in current]
            for mechanism in doomed:
                del current[mechanism]
            updated = {name: creds for name, creds in users.items() if name != user}
            if current:
                updated[user] = current
            return updated, doomed

        return self.file.modify(change)


# --- ACLs --------------------------------------------------------------------------------------------------------


def _parse_acls(raw: dict[str, Any]) -> Acls:
    return tuple(sorted({AclBinding.from_json(entry) for entry in raw["acls"]}))


def _dump_acls(acls: Acls) -> dict[str, Any]:
    return {"acls": [binding.to_json() for binding in acls]}


class AclStore:
    """ACL bindings (`tidelog-acls.json`)."""

    def __init__(self, log_dir: Path, *, check_interval: float = DEFAULT_CHECK_INTERVAL_S) -> None:
        self.file: JsonFile[Acls] = JsonFile(
            log_dir / ACLS_FILE, _parse_acls, _dump_acls, (), check_interval=check_interval
        )

    def bindings(self) -> Acls:
        return self.file.current()

    def add(self, bindings: list[AclBinding]) -> list[AclBinding]:
        """Add bindings (each validated first); returns those that were not there yet."""
        for binding in bindings:
            binding.validate()

        def change(acls: Acls) -> tuple[Acls, list[AclBinding]]:
            present = set(acls)
            new = [b for b in dict.fromkeys(bindings) if b not in present]
            return tuple(sorted(present | set(new))), new

        return self.file.modify(change)

    def remove(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """Remove every binding matching each filter; returns, per filter, the bindings it removed."""

        def change(acls: Acls) -> tuple[Acls, list[list[AclBinding]]]:
            removed = [[b for b in acls if f.matches(b)] for f in filters]
            doomed = {b for group in removed for b in group}
            return tuple(b for b in acls if b not in doomed), removed

        return self.file.modify(change)
