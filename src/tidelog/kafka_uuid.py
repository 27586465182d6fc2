"""Kafka's Uuid as text: 16 random bytes, base64url without padding (22 characters), never starting with '-'.

Topic ids, cluster ids and directory ids are all of this form, in both engines' files.
"""

from __future__ import annotations

import base64
import uuid


def new_kafka_uuid() -> str:
    """A random Uuid rendered as Kafka does."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


def is_kafka_uuid(text: str) -> bool:
    """Does `text` decode to exactly 16 bytes of base64url?"""
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except ValueError:
        return False
    return len(raw) == 16
