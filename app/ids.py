"""Random ids made on the request path."""

from __future__ import annotations

import os


def random_hex() -> str:
    """128 random bits as 32 hex digits: the form of a UUID4's ``hex`` and as unguessable,
    for a fraction of its cost (a request makes several)."""
    return os.urandom(16).hex()
