"""One length-delimited protobuf field, hand-encoded: enough to give Talos's Go clients the
protobuf form of a spec (VersionSpec, StaticPodSpec, …) without carrying its .proto."""

from __future__ import annotations


def field(number: int, value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    length, prefix = len(data), bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        prefix.append(byte | (0x80 if length else 0))
        if not length:
            break
    return bytes([number << 3 | 2]) + bytes(prefix) + data
