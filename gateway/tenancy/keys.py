"""API keys: random, shown once, stored only as HMAC-SHA256 under a server secret.

A key is ``cp-`` + 32 url-safe characters (192 random bits); admin keys are ``cp-admin-...``.
Redis holds ``HMAC(secret, key)`` only, so a dump of Redis does not reveal usable keys, and the
digest is compared in constant time after the lookup. Keys are never logged: use ``key_id``
(the first 12 hex digits of the digest) to name a key in logs, listings and revocation.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

KEY_PREFIX = "cp-"
ADMIN_PREFIX = "cp-admin-"
KEY_RANDOM_BYTES = 24  # 192 bits (>= 128 required)
KEY_ID_LEN = 12


def generate_key(admin: bool = False) -> str:
    return (ADMIN_PREFIX if admin else KEY_PREFIX) + secrets.token_urlsafe(KEY_RANDOM_BYTES)


def looks_like_key(key: str) -> bool:
    """Cheap shape check before any Redis round trip (and before hashing garbage)."""
    return key.startswith(KEY_PREFIX) and 16 <= len(key) <= 128 and key.isascii()


def key_digest(secret: bytes, key: str) -> str:
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()


def key_id(digest: str) -> str:
    return digest[:KEY_ID_LEN]


def digests_match(stored: str | bytes, computed: str) -> bool:
    stored_b = stored if isinstance(stored, bytes) else stored.encode()
    return hmac.compare_digest(stored_b, computed.encode())


def load_or_create_secret(state_dir: str | Path) -> bytes:
    """The server secret from ``<state_dir>/secret`` (created 0600 on first use), so that
    every gateway process and ``carpool tenants`` on this machine hash keys the same way.
    Several machines share one secret through ``CARPOOL_SECRET`` instead."""
    path = Path(state_dir) / "secret"
    if path.is_file():
        return path.read_bytes().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, value)
    finally:
        os.close(fd)
    return value


def resolve_secret(secret: str | None, state_dir: str | Path) -> bytes:
    return secret.encode() if secret else load_or_create_secret(state_dir)
