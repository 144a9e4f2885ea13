"""The dynamic-provider host: `python -m pulumi.dynamic`, except that our own errors reach the
engine as their message alone, and a preview keeps what an update cannot change.

Errors: the SDK's server answers every failed call with the full traceback, so an expected
failure (a zone cluster that does not answer, a discovery that found nothing) reads as
`Traceback (most recent call last): …` before the message that says what to do. A KontinuumError
(and its kin, kontinuum/errors.py) is raised on purpose with that message: only the message is
sent. Any other exception is a bug and keeps its traceback; so does everything with
KONTINUUM_DEBUG=1.

Previews: the SDK's server tells the engine it cannot preview, so at preview the engine hands a
changing resource's new inputs back as its outputs: every output that is not also an input is
unknown, and everything that reads one previews as changing (a cascade over the whole zone when
only a record changed). Neither the engine (v3.274) nor the SDK's server reads the diff's
`stables`. This host does (providers/previews.py): a preview's update carries each output the
diff named stable from the old outputs, so it stays known and nothing downstream changes.
Started by tools/plugins/plugin_guard.py (`python -m providers.host` in effect).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from pulumi.runtime.proto import provider_pb2_grpc

from kontinuum.errors import KontinuumError
from providers.previews import with_previews

_format_exc = traceback.format_exc
_add_servicer = provider_pb2_grpc.add_ResourceProviderServicer_to_server


def format_exc(limit: int | None = None, chain: bool = True) -> str:
    """traceback.format_exc as the SDK's server calls it while handling a failed call."""
    error = sys.exc_info()[1]
    if isinstance(error, KontinuumError) and not os.environ.get("KONTINUUM_DEBUG"):
        return str(error)
    return _format_exc(limit, chain)


def add_servicer(servicer, server) -> None:
    """What the SDK's server registers, with provider previews (it looks this up at call time)."""
    _add_servicer(with_previews(servicer), server)


def main() -> None:
    traceback.format_exc = format_exc  # the server module looks it up at call time
    provider_pb2_grpc.add_ResourceProviderServicer_to_server = add_servicer
    runpy.run_module("pulumi.dynamic", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
