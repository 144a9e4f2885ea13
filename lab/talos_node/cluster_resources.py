"""COSI resources an emulated machine serves from its cluster and its secrets, in YAML and in the
protobuf form Talos's Go clients decode (protos/definitions), as Talos v1.13.0 builds them:

- Nodenames.kubernetes.talos.dev `nodename` (k8s): the name of this machine's Node, its hostname
  (talosctl's drain finds the Node by it);
- Members.cluster.talos.dev (cluster): discovery's members, one per configured machine of the
  cluster, named by hostname, with addresses, machine type, "Talos (<version>)" and, on a
  control plane, the apiserver port (talosctl health and rotate-ca take the topology from them);
- StaticPodStatuses.kubernetes.talos.dev (k8s, `kube-system/<component>-<nodename>`): the status
  the kubelet reports for each static pod of a bootstrapped control plane: Running and Ready;
- APIServerConfigs, ControllerManagerConfigs and SchedulerConfigs (.kubernetes.talos.dev,
  controlplane, id = component) of a control plane: the image its config names, which talosctl
  upgrade-k8s watches and reads around each static pod update; its resource version is the
  component's config version (k8s_resources.config_version), which the static pod's
  talos.dev/config-version carries, as Talos bumps both with each rendered change;
- OSRootSecrets.secrets.talos.dev `os` and, on control planes, KubernetesRootSecrets `k8s`
  (secrets): the Talos API CA and the cluster's CAs from the machine config. Both are
  sensitive: only os:admin may read them (machined's COSI access policy: "not authorized").
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from google.protobuf import struct_pb2

from lab.talos_node import k8s_resources
from lab.talos_node.machineconfig import v1alpha1_document
from protos.gen.common import common_pb2
from protos.gen.definitions import resources_pb2 as defs

if TYPE_CHECKING:
    from lab.talos_node.node import EmulatedNode

NODENAME = "Nodenames.kubernetes.talos.dev"
MEMBER = "Members.cluster.talos.dev"
STATIC_POD_STATUS = "StaticPodStatuses.kubernetes.talos.dev"
OS_ROOT = "OSRootSecrets.secrets.talos.dev"
K8S_ROOT = "KubernetesRootSecrets.secrets.talos.dev"
APISERVER_CONFIG = "APIServerConfigs.kubernetes.talos.dev"
CONTROLLER_MANAGER_CONFIG = "ControllerManagerConfigs.kubernetes.talos.dev"
SCHEDULER_CONFIG = "SchedulerConfigs.kubernetes.talos.dev"
_COMPONENT_CONFIGS = {APISERVER_CONFIG: ("kube-apiserver",), CONTROLLER_MANAGER_CONFIG: ("kube-controller-manager",),
                      SCHEDULER_CONFIG: ("kube-scheduler",)}
TYPES = (NODENAME, MEMBER, STATIC_POD_STATUS, OS_ROOT, K8S_ROOT, *_COMPONENT_CONFIGS)

# (type, display type, namespace, aliases, sensitive, print columns): resources.Definition's fields.
DEFINITIONS = (
    (NODENAME, "Nodename", "k8s", (), False, (("Nodename", "{.nodename}"),)),
    (MEMBER, "Member", "cluster", (), False, (("Hostname", "{.hostname}"), ("Machine Type", "{.machineType}"),
                                              ("OS", "{.operatingSystem}"), ("Addresses", "{.addresses}"))),
    (STATIC_POD_STATUS, "StaticPodStatus", "k8s", ("podstatus",), False,
     (("Ready", '{.conditions[?(@.type=="Ready")].status}'),)),
    (APISERVER_CONFIG, "APIServerConfig", "controlplane", (), False, ()),
    (CONTROLLER_MANAGER_CONFIG, "ControllerManagerConfig", "controlplane", (), False, ()),
    (SCHEDULER_CONFIG, "SchedulerConfig", "controlplane", (), False, ()),
    (OS_ROOT, "OSRootSecret", "secrets", (), True, ()),
    (K8S_ROOT, "KubernetesRootSecret", "secrets", (), True, ()),
)
NAMESPACES = {
    "k8s": "Kubernetes all node types resources.",
    "cluster": "Cluster configuration and discovery resources.",
    "secrets": "Resources with secret material.",
}
OWNERS = {
    NODENAME: "k8s.NodenameController",
    MEMBER: "cluster.MemberController",
    STATIC_POD_STATUS: "k8s.KubeletStaticPodController",
    APISERVER_CONFIG: "k8s.ControlPlaneAPIServerController",
    CONTROLLER_MANAGER_CONFIG: "k8s.ControlPlaneControllerManagerController",
    SCHEDULER_CONFIG: "k8s.ControlPlaneSchedulerController",
    OS_ROOT: "secrets.RootController",
    K8S_ROOT: "secrets.RootController",
}
_MACHINE_TYPES = {"init": defs.TYPE_INIT, "controlplane": defs.TYPE_CONTROL_PLANE, "worker": defs.TYPE_WORKER}
_TYPE_NAMES = {"init": "init", "controlplane": "controlplane", "worker": "worker"}
STATIC_PODS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
APISERVER_PORT = 6443

Specs = dict[str, tuple[dict, bytes]]  # id → (YAML spec, protobuf spec)


def _ip(address: str) -> common_pb2.NetIP:
    return common_pb2.NetIP(ip=ipaddress.ip_address(address).packed)


def _pem(value: object) -> bytes:
    return base64.b64decode(str(value)) if value else b""


def _get(doc: object, *path: str) -> object:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _node_id(node: EmulatedNode) -> str:
    """A stable node identity (Talos keeps a random one on STATE)."""
    digest = hashlib.sha256(f"{node.cluster_key}/{node.address}".encode()).digest()
    return base64.b64encode(digest).decode().translate(str.maketrans("", "", "+/="))[:43]


def nodename(node: EmulatedNode) -> Specs:
    name = node.hostname.lower()
    spec = {"nodename": name, "hostnameVersion": "1", "skipNodeRegistration": False}
    return {"nodename": (spec, defs.NodenameSpec(nodename=name, hostname_version="1").SerializeToString())}


def members(node: EmulatedNode) -> Specs:
    """Every configured machine of this machine's cluster, as discovery lists them."""
    out: Specs = {}
    for other in node.registry.nodes_of(node.cluster_key) if node.cluster_key else []:
        config = other.config
        if config is None:
            continue
        os_name = f"Talos ({other.talos_version})"
        spec = {"nodeId": _node_id(other), "addresses": [other.address], "hostname": other.hostname,
                "machineType": _TYPE_NAMES[config.machine_type], "operatingSystem": os_name}
        proto = defs.MemberSpec(node_id=spec["nodeId"], addresses=[_ip(other.address)], hostname=other.hostname,
                                machine_type=_MACHINE_TYPES[config.machine_type], operating_system=os_name)
        if config.is_control_plane:
            spec["controlPlane"] = {"apiServerPort": APISERVER_PORT}
            proto.control_plane.api_server_port = APISERVER_PORT
        out[other.hostname] = (spec, proto.SerializeToString())
    return out


def _struct(obj: dict) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(obj)
    return struct


def static_pod_statuses(node: EmulatedNode) -> Specs:
    """The kubelet's view of a bootstrapped control plane's static pods: Running and Ready."""
    config = node.config
    if config is None or not config.is_control_plane or not node.registry.state(config.cluster_key).bootstrapped:
        return {}
    started = node.booted_at.ToJsonString()
    out: Specs = {}
    for component in STATIC_PODS:
        conditions = [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
                      for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]
        status = {"phase": "Running", "conditions": conditions, "hostIP": node.address, "podIP": node.address,
                  "startTime": started, "qosClass": "Burstable",
                  "containerStatuses": [{"name": component, "ready": True, "restartCount": 0, "started": True,
                                         "state": {"running": {"startedAt": started}}}]}
        proto = defs.StaticPodStatusSpec(pod_status=_struct(status)).SerializeToString()
        out[f"kube-system/{component}-{node.hostname.lower()}"] = (status, proto)
    return out


def _cert_and_key(crt: bytes, key: bytes) -> common_pb2.PEMEncodedCertificateAndKey:
    return common_pb2.PEMEncodedCertificateAndKey(crt=crt, key=key)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def os_root(node: EmulatedNode) -> Specs:
    """The Talos API CA (and the key on control planes), SANs, token and accepted CAs."""
    config = node.config
    assert config is not None
    machine = v1alpha1_document(config.raw).get("machine") or {}
    accepted = [_pem(c.get("crt")) for c in machine.get("acceptedCAs") or [] if isinstance(c, dict)]
    ips = [node.address] + [s for s in config.cert_sans if _is_ip(s)]
    names = [node.hostname] + [s for s in config.cert_sans if not _is_ip(s)]
    token = str(machine.get("token") or "")
    spec = {"issuingCA": {"crt": _b64(config.os_ca.crt), "key": _b64(config.os_ca.key)},
            "acceptedCAs": [{"crt": _b64(c)} for c in accepted], "certSANIPs": ips, "certSANDNSNames": names,
            "token": token}
    proto = defs.OSRootSpec(issuing_ca=_cert_and_key(config.os_ca.crt, config.os_ca.key),
                            cert_sani_ps=[_ip(a) for a in ips], cert_sandns_names=names, token=token,
                            accepted_c_as=[common_pb2.PEMEncodedCertificate(crt=c) for c in accepted])
    return {"os": (spec, proto.SerializeToString())}


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def k8s_root(node: EmulatedNode) -> Specs:
    """The cluster's CAs and secrets from the config, on control planes only."""
    config = node.config
    if config is None or not config.is_control_plane or config.k8s_ca is None:
        return {}
    cluster = v1alpha1_document(config.raw).get("cluster") or {}
    token_id, _, token_secret = str(cluster.get("token") or "").partition(".")
    aggregator = (_pem(_get(cluster, "aggregatorCA", "crt")), _pem(_get(cluster, "aggregatorCA", "key")))
    service_account = _pem(_get(cluster, "serviceAccount", "key"))
    accepted = [_pem(c.get("crt")) for c in cluster.get("acceptedCAs") or [] if isinstance(c, dict)]
    port = urlsplit(config.endpoint).port or APISERVER_PORT
    local = f"https://localhost:{port}"
    dns_domain = str(_get(cluster, "network", "dnsDomain") or "cluster.local")
    spec = {"name": config.cluster_name, "endpoint": config.endpoint, "local_endpoint": local,
            "certSANs": [str(s) for s in _get(cluster, "apiServer", "certSANs") or []], "dnsDomain": dns_domain,
            "issuingCA": {"crt": _b64(config.k8s_ca.crt), "key": _b64(config.k8s_ca.key)},
            "acceptedCAs": [{"crt": _b64(c)} for c in accepted],
            "serviceAccount": {"key": _b64(service_account)},
            "aggregatorCA": {"crt": _b64(aggregator[0]), "key": _b64(aggregator[1])},
            "bootstrapTokenID": token_id, "bootstrapTokenSecret": token_secret,
            "secretboxEncryptionSecret": str(cluster.get("secretboxEncryptionSecret") or "")}
    proto = defs.KubernetesRootSpec(
        name=config.cluster_name, endpoint=common_pb2.URL(full_path=config.endpoint),
        local_endpoint=common_pb2.URL(full_path=local), cert_sa_ns=spec["certSANs"], dns_domain=dns_domain,
        issuing_ca=_cert_and_key(config.k8s_ca.crt, config.k8s_ca.key),
        service_account=common_pb2.PEMEncodedKey(key=service_account),
        aggregator_ca=_cert_and_key(*aggregator), bootstrap_token_id=token_id, bootstrap_token_secret=token_secret,
        secretbox_encryption_secret=spec["secretboxEncryptionSecret"],
        accepted_c_as=[common_pb2.PEMEncodedCertificate(crt=c) for c in accepted])
    return {"k8s": (spec, proto.SerializeToString())}


def component_config(node: EmulatedNode, rtype: str) -> Specs:
    """A control plane component's config as Talos renders it from the machine config (its image)."""
    config = node.config
    if config is None or not config.is_control_plane:
        return {}
    component = _COMPONENT_CONFIGS[rtype][0]
    image = k8s_resources.image(v1alpha1_document(config.raw), component)  # what its static pod runs
    if rtype == APISERVER_CONFIG:
        spec = {"image": image, "controlPlaneEndpoint": config.endpoint}
        proto = defs.APIServerConfigSpec(image=image, control_plane_endpoint=config.endpoint)
    else:
        spec = {"enabled": True, "image": image}
        message = defs.ControllerManagerConfigSpec if rtype == CONTROLLER_MANAGER_CONFIG else defs.SchedulerConfigSpec
        proto = message(enabled=True, image=image)
    return {component: (spec, proto.SerializeToString())}


def version(node: EmulatedNode, rtype: str) -> str:
    """The resource version: a component config's config version, else 1 (never changed here)."""
    if rtype not in _COMPONENT_CONFIGS or node.config is None:
        return "1"
    doc = v1alpha1_document(node.config.raw)
    return str(k8s_resources.config_version(node.address, doc, _COMPONENT_CONFIGS[rtype][0]))


_BUILDERS = {NODENAME: nodename, MEMBER: members, STATIC_POD_STATUS: static_pod_statuses, OS_ROOT: os_root,
             K8S_ROOT: k8s_root}


def specs(node: EmulatedNode, rtype: str) -> Specs:
    """The resources of `rtype` a configured machine holds now ({} while it has no config)."""
    if node.config is None or node.mode == "maintenance":
        return {}
    if rtype in _COMPONENT_CONFIGS:
        return component_config(node, rtype)
    return _BUILDERS[rtype](node)
