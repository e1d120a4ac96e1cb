"""API keys: generated with enough entropy that a plain SHA-256 is a safe hash.

The plaintext is shown once, when issued; only the hash and a short display
prefix are ever stored.
"""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "sk-lgw-"
DISPLAY_PREFIX_LEN = len(KEY_PREFIX) + 6


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def display_prefix(key: str) -> str:
    return key[:DISPLAY_PREFIX_LEN]


def new_key_id() -> str:
    return "key_" + secrets.token_hex(8)
