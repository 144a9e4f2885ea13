"""What makes a byte stream an intact etcd snapshot, checked as it streams (talosctl's own
check plus etcd's): the database is bbolt pages (4096-byte multiples here, 512 at least), and
etcd appends the sha256 of the database, so size % 512 == 32 and the last 32 bytes are the
sha256 of everything before them. The first page of a bbolt file carries its magic number."""

from __future__ import annotations

import hashlib
import struct

TRAILER = 32
BOLT_MAGIC = 0xED0CDAED  # bbolt meta page: 16-byte page header, then the u32 magic
MIN_SIZE = 2 * 512 + TRAILER


class SnapshotInvalid(ValueError):
    """Not an intact etcd snapshot; the message says what is wrong."""


class SnapshotCheck:
    """Feed chunks in order; `finish()` verifies the whole and returns (size, sha256 hex of the
    database). Keeps only the last 32 bytes back: streams of any size."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._tail = b""
        self._head = b""
        self.size = 0

    def update(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if len(self._head) < 20:
            self._head += chunk[: 20 - len(self._head)]
        data = self._tail + chunk
        self._hash.update(data[:-TRAILER] if len(data) > TRAILER else b"")
        self._tail = data[-TRAILER:] if len(data) > TRAILER else data

    def finish(self) -> tuple[int, str]:
        if self.size < MIN_SIZE:
            raise SnapshotInvalid(f"{self.size} bytes is too short for an etcd snapshot (truncated?)")
        if self.size % 512 != TRAILER:
            raise SnapshotInvalid(f"size {self.size} is not a multiple of 512 plus etcd's 32-byte sha256 trailer "
                                  "(truncated or not an etcd snapshot)")
        if struct.unpack_from("<I", self._head, 16)[0] != BOLT_MAGIC:
            raise SnapshotInvalid("the first page is not an etcd (bbolt) database")
        digest = self._hash.digest()
        if digest != self._tail:
            raise SnapshotInvalid("etcd's sha256 trailer does not match the database (corrupted)")
        return self.size, digest.hex()


def check(data: bytes) -> tuple[int, str]:
    c = SnapshotCheck()
    c.update(data)
    return c.finish()
