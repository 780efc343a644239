"""What a listing shows of an API key, and the checks on a key's name and expiry.

A key record (``{ns}:apikey:{digest}``, ``bus/keys.py``) holds its tenant, its digest, when it
was created, its name, its expiry and when it was last used (unix seconds), never the key.
``last_used`` is written at most once a minute (``LAST_USED_EVERY_S``), when a gateway's auth
cache looks the key up, not per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LAST_USED_EVERY_S = 60
MAX_NAME_LEN = 64
MAX_GRACE_S = 30 * 86400  # the longest a rotated key stays valid
MAX_EXPIRY_S = 10 * 366 * 86400  # the furthest expiry a key may be given


@dataclass(frozen=True)
class KeyLookup:
    tenant: str
    expires_at: int | None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


@dataclass(frozen=True)
class KeyInfo:
    key_id: str
    name: str
    created: int | None
    last_used: int | None
    expires_at: int | None

    @classmethod
    def from_hash(cls, kid: str, h: dict[Any, Any]) -> KeyInfo:
        d = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes)
                                                            else v) for k, v in h.items()}

        def num(name: str) -> int | None:
            return int(d[name]) if d.get(name) else None

        return cls(kid, d.get("name", ""), num("created"), num("last_used"), num("expires"))

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def to_json(self) -> dict[str, Any]:
        return {"key_id": self.key_id, "name": self.name, "created": self.created,
                "last_used": self.last_used, "expires_at": self.expires_at}


def check_key_fields(name: str, expires_at: float | None, now: float) -> None:
    """ValueError for a name that is not short printable text, or an expiry that is not in
    the future (within ``MAX_EXPIRY_S``)."""
    if not isinstance(name, str) or len(name) > MAX_NAME_LEN or not name.isprintable():
        raise ValueError(f"key name must be printable text of at most {MAX_NAME_LEN} "
                         f"characters, got {name!r}")
    if expires_at is not None and not now < expires_at <= now + MAX_EXPIRY_S:
        raise ValueError("expires_at must be in the future (and within 10 years)")
