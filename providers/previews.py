"""Provider previews for the dynamic-provider host (providers/host.py): a preview plans exactly
what the up will do.

The engine calls a provider's Create and Update at preview only when the provider says it
supports previews; otherwise it takes a changing resource's new inputs as its outputs, so each
output that is not also an input is unknown at preview, and so is everything computed from it.
A TalosSecrets that only records a token would then preview as a new bundle for the whole zone.

Here the SDK's servicer says it supports previews and:
- Diff also answers the diff's `stables` (DiffResult.stables: outputs this update cannot
  change), which the SDK's server drops; the host remembers them per resource (URN);
- a preview's Create returns the inputs as outputs, as the engine does without us;
- a preview's Update returns the new inputs with each stable output carried from the old
  outputs, so it is known at preview; every other output stays unknown, as before.
Nothing runs at preview that did not before: no provider's create or update is called.
"""

from __future__ import annotations

import functools
import threading

from google.protobuf import struct_pb2


def with_previews(servicer):
    """The SDK's DynamicResourceProviderServicer, its Configure, Diff, Create and Update replaced
    on the instance (gRPC registers the instance's methods)."""
    sdk = type(servicer).Diff.__globals__  # the SDK server module's globals (it runs as __main__)
    rpc, proto, key, get_provider = sdk["rpc"], sdk["proto"], sdk["PROVIDER_KEY"], sdk["get_provider"]
    abort = sdk["_abort_with_traceback"]
    configure, create, update = servicer.Configure, servicer.Create, servicer.Update
    stables = Stables()

    def Configure(request, context):  # noqa: N802 - gRPC method names
        response = configure(request, context)
        response.supportsPreview = True
        return response

    def Diff(_self, request, context):  # noqa: N802
        olds = rpc.deserialize_properties(request.olds, True)
        news = rpc.deserialize_properties(request.news, True)
        provider = get_provider(olds if news.get(key) == rpc.UNKNOWN else news, servicer._config)
        result = provider.diff(request.id, olds, news)
        stables.put(request.urn, result.stables or [])
        return diff_response(proto, result)

    def Create(request, context):  # noqa: N802
        if request.preview:
            return proto.CreateResponse(id="", properties=request.properties)
        return create(request, context)

    def Update(request, context):  # noqa: N802
        if not request.preview:
            return update(request, context)
        return proto.UpdateResponse(properties=preview_outputs(request.olds, request.news, stables.pop(request.urn)))

    servicer.Configure, servicer.Create, servicer.Update = Configure, Create, Update
    servicer.Diff = functools.partial(abort(Diff), servicer)
    return servicer


class Stables:
    """The stable outputs each resource's last diff named, until its preview update reads them."""

    def __init__(self) -> None:
        self._by_urn: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def put(self, urn: str, keys) -> None:
        with self._lock:
            self._by_urn[urn] = [str(k) for k in keys]

    def pop(self, urn: str) -> list[str]:
        with self._lock:
            return self._by_urn.pop(urn, [])


def diff_response(proto, result):
    """The SDK server's DiffResponse, plus the stables it drops."""
    fields: dict = {"changes": proto.DiffResponse.DIFF_UNKNOWN if result.changes is None else
                    proto.DiffResponse.DIFF_SOME if result.changes else proto.DiffResponse.DIFF_NONE}
    if result.replaces is not None:
        fields["replaces"] = result.replaces
    if result.stables:
        fields["stables"] = list(result.stables)
    if result.delete_before_replace is not None:
        fields["deleteBeforeReplace"] = result.delete_before_replace
    return proto.DiffResponse(**fields)


def preview_outputs(olds: struct_pb2.Struct, news: struct_pb2.Struct, stable: list[str]) -> struct_pb2.Struct:
    """The new inputs (unknowns as the engine sent them), each stable output as it was."""
    outs = struct_pb2.Struct()
    outs.CopyFrom(news)
    for k in stable:
        if k in olds.fields:
            outs.fields[k].CopyFrom(olds.fields[k])
    return outs
