"""Instance: a machine registered in the hub inventory and discovered in maintenance mode.

check/diff are pure (no I/O), so `pulumi preview` contacts neither the hub nor a node.
create registers the hub object, then probes spec.interfaces in order; the first address
whose Talos API answers wins. Discovery is recorded once (seeds): an update only brings the
hub object up to date and probes again only a machine that was never discovered, because a
configured machine refuses maintenance-mode clients. `pulumi refresh` (read) reports what the
hub recorded; it probes only a machine that is still undiscovered.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, diff_inputs, with_secret_outputs

REPLACE_ON = ("name",)
UPDATE_ON = ("interfaces", "labels", "talosPort", "probeTimeout", "unregisterOnDelete", "hubKubeconfig")


def _inventory(hub_kubeconfig: str):
    """The hub's Instances. Imported here: the program registering this resource never needs
    the kubernetes client, only the provider process does."""
    from kontinuum.hub.inventory import Inventory

    return Inventory.from_kubeconfig(hub_kubeconfig)


def _probe(inv, name: str, props: dict, *, raise_if_unreachable: bool) -> dict:
    from kontinuum.hub.discovery import probe_and_record

    return probe_and_record(inv, name, props["interfaces"], port=int(props.get("talosPort") or 50000),
                            timeout=float(props.get("probeTimeout") or 10), raise_if_unreachable=raise_if_unreachable)


def check_instance(news: dict[str, Any]) -> list[CheckFailure]:
    failures = []
    if not news.get("name"):
        failures.append(CheckFailure("name", "required"))
    interfaces = news.get("interfaces")
    if not isinstance(interfaces, list) or not interfaces or not all(isinstance(i, str) and i for i in interfaces):
        failures.append(CheckFailure("interfaces", "must be a non-empty list of addresses"))
    if not news.get("hubKubeconfig"):
        failures.append(CheckFailure("hubKubeconfig", "required: the hub's kubeconfig (secret)"))
    return failures


def _labels_lost(props: dict) -> bool:
    from kontinuum.hub.crds import LABEL_LOST

    return (props.get("labels") or {}).get(LABEL_LOST) == "true"


class InstanceProvider(ResourceProvider):
    """Stateless: everything it needs arrives in the inputs, credentials as secrets."""

    def check(self, _olds, news):
        return CheckResult(news, check_instance(news))

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, replace_on=REPLACE_ON, update_on=UPDATE_ON)

    def _converge(self, props: dict, *, fresh: bool) -> dict:
        """Register the hub object; probe when the resource is new (it discovers afresh) or its
        machine was never discovered."""
        from kontinuum.hub.discovery import recorded

        inv = _inventory(props["hubKubeconfig"])
        obj = inv.register(props["name"], props["interfaces"], props.get("labels") or {})
        status = recorded(obj)
        # A machine declared lost is never probed: it is dead, and waiting on it is what `lost` avoids.
        if (fresh or not status["discovered"]) and not _labels_lost(props):
            status = _probe(inv, props["name"], props, raise_if_unreachable=True)
        return {**props, **status}

    def create(self, props):
        return CreateResult(id_=props["name"], outs=self._converge(props, fresh=True))

    def update(self, _id, _olds, news):
        return UpdateResult(outs=self._converge(news, fresh=False))

    def read(self, id_, props):
        from kontinuum.hub.discovery import recorded

        inv = _inventory(props["hubKubeconfig"])
        obj = inv.get(id_)
        if obj is None:
            return ReadResult(id_=None, outs={})  # gone from the hub: Pulumi drops it from state
        status = recorded(obj)
        if not status["discovered"] and not _labels_lost(props):
            status = _probe(inv, id_, props, raise_if_unreachable=False)
        return ReadResult(id_=id_, outs={**props, **status})

    def delete(self, id_, props):
        if props.get("unregisterOnDelete"):
            _inventory(props["hubKubeconfig"]).unregister(id_)


class Instance(TypedResource, module="hub", name="Instance"):
    """A machine in the hub inventory. Outputs: discovered, address, talosVersion, fingerprint
    (of its maintenance certificate; a maintenance apply requires it), links."""

    discovered: pulumi.Output[bool]
    address: pulumi.Output[str]
    talosVersion: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        name: pulumi.Input[str],
        interfaces: pulumi.Input[list],
        labels: pulumi.Input[dict],
        hub_kubeconfig: pulumi.Input[str],
        unregister_on_delete: bool = False,
        talos_port: int = 50000,
        probe_timeout: float = 10.0,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "name": name,
            "interfaces": interfaces,
            "labels": labels,
            "hubKubeconfig": pulumi.Output.secret(hub_kubeconfig),
            "unregisterOnDelete": unregister_on_delete,
            "talosPort": talos_port,
            "probeTimeout": probe_timeout,
            "discovered": None,
            "address": None,
            "talosVersion": None,
            "fingerprint": None,
            "links": None,
        }
        super().__init__(InstanceProvider(), resource_name, props, with_secret_outputs(opts, "hubKubeconfig"))
