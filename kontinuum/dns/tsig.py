"""TSIG keys as BIND's `tsig-keygen` (and `rndc-confgen`, `ddns-confgen`) print them.

    key "zone-updater" {
            algorithm hmac-sha256;
            secret "base64…";
    };

Several `key` clauses may follow each other. Parsing errors never quote the text: it is a secret.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field

ALGORITHMS = ("hmac-sha256", "hmac-sha512", "hmac-sha384", "hmac-sha224", "hmac-sha1", "hmac-md5")

_KEY = re.compile(r'key\s+"?(?P<name>[^"\s{]+)"?\s*\{(?P<body>[^{}]*)\}\s*;?', re.S)
_STMT = re.compile(r'(?P<k>algorithm|secret)\s+"?(?P<v>[^";\s]+)"?\s*;', re.S)


@dataclass(frozen=True)
class TsigKey:
    name: str
    algorithm: str
    secret: str = field(repr=False)  # base64, as in the key file


class TsigKeyError(ValueError):
    """The key text is not usable; the message names the clause, never the secret."""


def parse(text: str) -> dict[str, TsigKey]:
    """{key name (lower case, no trailing dot): TsigKey}."""
    stripped = re.sub(r"(#|//)[^\n]*", "", text)
    keys: dict[str, TsigKey] = {}
    for n, m in enumerate(_KEY.finditer(stripped), 1):
        name = m["name"].rstrip(".").lower()
        found = {s["k"]: s["v"] for s in _STMT.finditer(m["body"])}
        if "secret" not in found or "algorithm" not in found:
            raise TsigKeyError(f"key {name!r} (clause {n}) needs both `algorithm` and `secret`")
        algorithm = found["algorithm"].lower()
        if algorithm not in ALGORITHMS:
            raise TsigKeyError(f"key {name!r}: algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
        try:
            base64.b64decode(found["secret"], validate=True)
        except (binascii.Error, ValueError):
            raise TsigKeyError(f"key {name!r}: `secret` is not base64") from None
        if name in keys:
            raise TsigKeyError(f"key {name!r} is defined twice")
        keys[name] = TsigKey(name, algorithm, found["secret"])
    if not keys:
        raise TsigKeyError('no `key "name" { algorithm …; secret "…"; };` clause found (the form tsig-keygen prints)')
    return keys
