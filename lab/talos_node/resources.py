"""The COSI resources an emulated node serves over cosi.resource.State.

Enough for discovery the way talosctl does it: resource definitions and namespaces (`meta`),
the Talos version and machine status (`runtime`), links and addresses (`network`), and on a
configured control plane the bootstrap manifests of its current config (`controlplane`,
manifests.py; maintenance mode refuses them). Specs are served as YAML (`yaml_spec`), as Talos
does; the meta specs and the manifests also carry their protobuf form.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

import yaml
from google.protobuf import struct_pb2
from google.protobuf.timestamp_pb2 import Timestamp

from lab.talos_node import cluster_resources, k8s_resources, protoenc
from lab.talos_node import manifests as bootstrap
from protos.gen.v1alpha1 import meta_pb2, resource_pb2


@dataclass(frozen=True)
class Definition:
    type: str
    display: str
    namespace: str
    aliases: tuple[str, ...] = ()
    sensitive: bool = False
    columns: tuple[tuple[str, str], ...] = ()  # (name, JSONPath into the spec): what `talosctl get` prints

    @property
    def id(self) -> str:
        return self.type.lower()

    def all_aliases(self) -> list[str]:
        """Our take on COSI's automatic aliases: display name, plural, initials, dotted prefixes."""
        plural, *rest = self.type.split(".")
        initials = "".join(re.findall(r"[A-Z]", self.display)).lower()
        prefixes = [".".join([plural, *rest[:i]]).lower() for i in range(1, len(rest))]
        seen: list[str] = []
        for alias in (self.display.lower(), plural.lower(), initials, *prefixes, *self.aliases):
            if alias and alias not in seen:
                seen.append(alias)
        return seen

    def spec(self) -> dict:
        return {
            "type": self.type,
            "displayType": self.display,
            "defaultNamespace": self.namespace,
            "aliases": list(self.aliases),
            "allAliases": self.all_aliases(),
            "printColumns": [{"name": name, "jsonPath": path} for name, path in self.columns],
            "sensitivity": "sensitive" if self.sensitive else "non-sensitive",
        }

    def proto(self) -> bytes:
        return meta_pb2.ResourceDefinitionSpec(
            resource_type=self.type,
            display_type=self.display,
            default_namespace=self.namespace,
            aliases=list(self.aliases),
            all_aliases=self.all_aliases(),
            print_columns=[meta_pb2.ResourceDefinitionSpec.PrintColumn(name=n, json_path=p) for n, p in self.columns],
            sensitivity=1 if self.sensitive else 0,
        ).SerializeToString()


RD = "ResourceDefinitions.meta.cosi.dev"
NAMESPACE = "Namespaces.meta.cosi.dev"
VERSION = "Versions.runtime.talos.dev"
MACHINE_STATUS = "MachineStatuses.runtime.talos.dev"
LINK = "LinkStatuses.net.talos.dev"
ADDRESS = "AddressStatuses.net.talos.dev"
MACHINE_CONFIG = "MachineConfigs.config.talos.dev"
SERVICE = "Services.v1alpha1.talos.dev"

DEFINITIONS = {
    d.type: d
    for d in (
        Definition(RD, "ResourceDefinition", "meta", ("resourcedefinitions", "api-resources")),
        Definition(NAMESPACE, "Namespace", "meta", ("namespaces", "ns")),
        Definition(VERSION, "Version", "runtime", ("version", "versions")),
        Definition(MACHINE_STATUS, "MachineStatus", "runtime", ("machinestatus", "machinestatuses"),
                   columns=(("Stage", "{.stage}"), ("Ready", "{.status.ready}"))),
        *(Definition(*d) for d in cluster_resources.DEFINITIONS),  # served by cosi_api.py
        Definition(LINK, "LinkStatus", "network", ("link", "links")),
        Definition(ADDRESS, "AddressStatus", "network", ("address", "addresses")),
        Definition(bootstrap.TYPE, "Manifest", bootstrap.NAMESPACE, ("manifest", "manifests")),
        Definition(MACHINE_CONFIG, "MachineConfig", "config", ("machineconfig", "mc"), sensitive=True),
        *(Definition(t, display, k8s_resources.NAMESPACE) for t, display in k8s_resources.DEFINITIONS),
        Definition(SERVICE, "Service", "runtime", ("svc",)),
    )
}
NAMESPACES = {
    "meta": "Metadata namespace which contains resource definitions and namespaces.",
    "runtime": "Talos runtime resources.",
    **cluster_resources.NAMESPACES,
    "network": "Networking resources.",
    bootstrap.NAMESPACE: "Control plane resources.",
    "config": "Talos node configuration.",
    k8s_resources.NAMESPACE: k8s_resources.NAMESPACE_TEXT,
}


@dataclass(frozen=True)
class NodeFacts:
    """What the resources describe: one emulated machine."""

    address: str
    talos_version: str
    stage: str  # maintenance, booting, running, rebooting (machine_status.py)
    ready: bool
    unmet: list = field(default_factory=list)  # MachineStatus unmetConditions [{name, reason}]
    services: dict = field(default_factory=dict)  # Running service id → Service spec (services.py)
    manifests: dict = field(default_factory=dict)  # bootstrap manifest id → objects (control planes)
    config: bytes = b""  # the applied machine config (configured nodes only)


def _manifest_proto(items: list[dict]) -> bytes:
    """Talos's ManifestSpec (items = 1, repeated SingleManifest{object = 1, google.protobuf.Struct}),
    as protoenc encodes its map[string]any: what Talos's Go client decodes."""
    out = b""
    for obj in items:
        struct = struct_pb2.Struct()
        struct.update(obj)
        out += protoenc.field(1, protoenc.field(1, struct.SerializeToString()))
    return out


def _mac(address: str) -> str:
    """A stable, locally administered MAC derived from the node's address."""
    raw = ipaddress.ip_address(address).packed[-4:]
    return ":".join(f"{b:02x}" for b in (0x02, 0x00, *raw))


def _links(facts: NodeFacts) -> dict[str, dict]:
    return {
        "eth0": {
            "index": 2,
            "type": "ether",
            "linkIndex": 0,
            "flags": "UP,BROADCAST,RUNNING,MULTICAST,LOWER_UP",
            "hardwareAddr": _mac(facts.address),
            "permanentAddr": _mac(facts.address),
            "broadcastAddr": "ff:ff:ff:ff:ff:ff",
            "mtu": 1500,
            "queueDisc": "fq_codel",
            "operationalState": "up",
            "kind": "",
            "slaveKind": "",
            "busPath": "0000:00:03.0",
            "driver": "virtio_net",
            "linkState": True,
            "speedMbit": 1000,
            "port": "Other",
            "duplex": "Full",
        },
        "lo": {
            "index": 1,
            "type": "loopback",
            "linkIndex": 0,
            "flags": "UP,LOOPBACK,RUNNING,LOWER_UP",
            "hardwareAddr": "00:00:00:00:00:00",
            "broadcastAddr": "00:00:00:00:00:00",
            "mtu": 65536,
            "queueDisc": "noqueue",
            "operationalState": "unknown",
            "kind": "",
            "slaveKind": "",
            "linkState": False,
        },
    }


def _addresses(facts: NodeFacts) -> dict[str, dict]:
    def entry(link: str, index: int, cidr: str, scope: str) -> tuple[str, dict]:
        iface = ipaddress.ip_interface(cidr)
        family = "inet4" if iface.version == 4 else "inet6"
        return f"{link}/{cidr}", {
            "address": cidr,
            "local": str(iface.ip),
            "linkIndex": index,
            "linkName": link,
            "family": family,
            "scope": scope,
            "flags": "permanent",
            "priority": 1024,
        }

    return dict(
        [
            entry("eth0", 2, f"{facts.address}/8", "global"),
            entry("lo", 1, "127.0.0.1/8", "host"),
            entry("lo", 1, "::1/128", "host"),
        ]
    )


def specs(facts: NodeFacts) -> dict[tuple[str, str], dict[str, tuple[dict, bytes]]]:
    """(namespace, type) -> {id: (yaml spec, proto spec)} for everything the node serves."""
    out: dict[tuple[str, str], dict[str, tuple[dict, bytes]]] = {
        ("meta", RD): {d.id: (d.spec(), d.proto()) for d in DEFINITIONS.values()},
        ("meta", NAMESPACE): {
            name: ({"description": text}, meta_pb2.NamespaceSpec(description=text).SerializeToString())
            for name, text in NAMESPACES.items()
        },
        ("runtime", VERSION): {"version": ({"version": facts.talos_version}, protoenc.field(1, facts.talos_version))},
        ("runtime", MACHINE_STATUS): {
            "machine": ({"stage": facts.stage, "status": {"ready": facts.ready, "unmetConditions": facts.unmet}}, b"")
        },
        ("runtime", SERVICE): {sid: (spec, b"") for sid, spec in facts.services.items()},
        ("network", LINK): {name: (spec, b"") for name, spec in _links(facts).items()},
        ("network", ADDRESS): {name: (spec, b"") for name, spec in _addresses(facts).items()},
        # Talos serves a Manifest's spec as the YAML list of its objects (ManifestSpec.MarshalYAML).
        (bootstrap.NAMESPACE, bootstrap.TYPE): {rid: (items, _manifest_proto(items)) for rid, items in facts.manifests.items()},
    }
    if facts.config:  # Talos serves the active config as MachineConfig v1alpha1 (its YAML as the spec)
        out[("config", MACHINE_CONFIG)] = {"v1alpha1": (facts.config.decode(), b"")}
    out.update(k8s_resources.specs_of(facts.config, facts.address))  # StaticPods, KubeletSpec
    return out


_OWNERS = {
    VERSION: "",
    MACHINE_STATUS: "runtime.MachineStatusController",
    **cluster_resources.OWNERS,
    LINK: "network.LinkStatusController",
    ADDRESS: "network.AddressStatusController",
    bootstrap.TYPE: "k8s.ManifestController",
    MACHINE_CONFIG: "config.AcquireController",
    **k8s_resources.OWNERS,
    SERVICE: "v1alpha1.ServiceController",
}


def resource(namespace: str, rtype: str, rid: str, spec: dict | list | str, proto: bytes,
             booted: Timestamp) -> resource_pb2.Resource:
    return resource_pb2.Resource(
        metadata=resource_pb2.Metadata(
            namespace=namespace,
            type=rtype,
            id=rid,
            version="1",
            owner=_OWNERS.get(rtype, ""),
            phase="running",
            created=booted,
            updated=booted,
        ),
        spec=resource_pb2.Spec(proto_spec=proto,
                               yaml_spec=spec if isinstance(spec, str) else yaml.safe_dump(spec, sort_keys=False)),
    )
