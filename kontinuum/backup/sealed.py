"""The encrypted backup file: an etcd snapshot sealed with AES-256-GCM (cryptography's AEAD),
written and read as a stream so no plaintext ever touches the disk.

Layout:
    MAGIC | u32 header length | header (JSON, plaintext, authenticated) | 16-byte salt |
    segments: u32 length | ciphertext (at most SEGMENT bytes of plaintext + 16-byte tag)

The file key is HKDF-SHA256(zone backup key, salt), so one zone key seals any number of files
without nonce reuse. Segment i's nonce is i (11 bytes) followed by 1 for the last segment and
0 otherwise, and every segment authenticates the header: a reordered, dropped, truncated or
appended segment, an edited header or another key all fail to open. The header names the zone
and the cluster identity (hashes only) so a restore can refuse another cluster's snapshot
before anything is touched.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MAGIC = b"KONTINUUM-ETCD-BACKUP/1\n"
SEGMENT = 1 << 20
TAG = 16
SALT = 16
MAX_HEADER = 64 * 1024
KEY_BYTES = 32


class SealedFileError(ValueError):
    """The file cannot be opened; the message says why (wrong key, corrupted, truncated)."""


def new_key() -> str:
    """A fresh zone backup key, base64 (what the BackupKey resource keeps as a secret)."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def _key_bytes(key: str) -> bytes:
    try:
        raw = base64.b64decode(key, validate=True)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != KEY_BYTES:
        raise SealedFileError("the backup key is not 32 bytes of base64 (is it the zone's backupKey output?)")
    return raw


def key_id(key: str) -> str:
    """A public name for a key: tells 'another key' from 'corrupted' without revealing it."""
    return hashlib.sha256(b"kontinuum backup key id\0" + _key_bytes(key)).hexdigest()[:16]


def _file_key(key: str, salt: bytes) -> AESGCM:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=b"kontinuum etcd backup v1").derive(
        _key_bytes(key))
    return AESGCM(derived)


def _nonce(index: int, last: bool) -> bytes:
    return index.to_bytes(11, "big") + (b"\x01" if last else b"\x00")


@dataclass(frozen=True)
class Header:
    zone: str  # <region>-<zone>
    created: str  # RFC 3339 UTC
    key_id: str
    cluster_id_sha256: str  # sha256 of the Talos cluster.id (the secret itself never leaves the state)
    etcd_ca_sha256: str  # sha256 of the etcd CA certificate (DER)
    node: str  # the control plane the snapshot came from

    def encode(self) -> bytes:
        return json.dumps({"format": 1, **self.__dict__}, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Header":
        try:
            doc = json.loads(raw)
            return cls(**{k: str(doc[k]) for k in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError):
            raise SealedFileError("the backup header is unreadable (not a Kontinuum backup, or corrupted)") from None


class Sealer:
    """Write side: `write(chunk)` as the snapshot streams in, then `close()`."""

    def __init__(self, out: BinaryIO, key: str, header: Header) -> None:
        self._out = out
        self._salt = os.urandom(SALT)
        self._aead = _file_key(key, self._salt)
        self._aad = header.encode()
        self._buf = bytearray()
        self._index = 0
        out.write(MAGIC + struct.pack(">I", len(self._aad)) + self._aad + self._salt)

    def _emit(self, data: bytes, last: bool) -> None:
        sealed = self._aead.encrypt(_nonce(self._index, last), data, self._aad)
        self._out.write(struct.pack(">I", len(sealed)) + sealed)
        self._index += 1

    def write(self, chunk: bytes) -> None:
        self._buf += chunk
        while len(self._buf) > SEGMENT:
            self._emit(bytes(self._buf[:SEGMENT]), last=False)
            del self._buf[:SEGMENT]

    def close(self) -> None:
        self._emit(bytes(self._buf), last=True)
        self._buf.clear()


def read_header(f: BinaryIO) -> tuple[Header, bytes, bytes]:
    """(header, its raw bytes, salt) from the start of a backup file."""
    if f.read(len(MAGIC)) != MAGIC:
        raise SealedFileError("not a Kontinuum etcd backup file (its first bytes are not the format's marker)")
    raw_len = f.read(4)
    if len(raw_len) != 4 or not 0 < struct.unpack(">I", raw_len)[0] <= MAX_HEADER:
        raise SealedFileError("the backup header is truncated or corrupted")
    raw = f.read(struct.unpack(">I", raw_len)[0])
    salt = f.read(SALT)
    if len(salt) != SALT:
        raise SealedFileError("the backup file is truncated (it ends inside its header)")
    return Header.decode(raw), raw, salt


def open_segments(f: BinaryIO, key: str) -> tuple[Header, Iterator[bytes]]:
    """The header, and an iterator of plaintext chunks that raises SealedFileError on any
    tampering, truncation or wrong key (a chunk is only yielded once authenticated)."""
    header, aad, salt = read_header(f)
    if header.key_id != key_id(key):
        raise SealedFileError(f"the file was sealed with another backup key (key id {header.key_id}; this zone's "
                              f"is {key_id(key)}): a backup of another stack or zone, or of a recreated zone")
    aead = _file_key(key, salt)

    def chunks() -> Iterator[bytes]:
        index = 0
        while True:
            raw_len = f.read(4)
            if not raw_len:
                raise SealedFileError("the backup file is truncated (its last segment is missing)")
            length = struct.unpack(">I", raw_len.rjust(4, b"\0"))[0] if len(raw_len) == 4 else -1
            if not TAG <= length <= SEGMENT + TAG:
                raise SealedFileError(f"the backup file is corrupted or truncated at segment {index}")
            sealed = f.read(length)
            if len(sealed) != length:
                raise SealedFileError(f"the backup file is truncated inside segment {index}")
            for last in (False, True):
                try:
                    plain = aead.decrypt(_nonce(index, last), sealed, aad)
                    break
                except InvalidTag:
                    continue
            else:
                raise SealedFileError(f"segment {index} fails authentication: the file is corrupted")
            yield plain
            index += 1
            if last:
                if f.read(1):
                    raise SealedFileError("the backup file has data after its last segment (corrupted)")
                return

    return header, chunks()


def seal_stream(out: BinaryIO, key: str, header: Header, produce: Callable[[Callable[[bytes], None]], object]) -> None:
    """Seal whatever `produce(write)` writes."""
    sealer = Sealer(out, key, header)
    produce(sealer.write)
    sealer.close()
