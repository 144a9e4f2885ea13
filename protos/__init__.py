"""Our own subset of the Talos API protos and the stubs generated from them.

Importing this package makes sure protos/gen is current (see _stubs.py), so
`from protos.gen.machine import machine_pb2` works from a fresh clone.
"""

from protos._stubs import ensure as _ensure

_ensure()
