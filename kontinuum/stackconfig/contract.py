"""The stack config contract (`kontinuum:` namespace), defined once.

The validator (parse.py), the JSON Schema (`python -m kontinuum schema`, shipped as
stacks/kontinuum.schema.json) and the README's stack-config table all come from STACK below.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from kontinuum.backup import destination as backup_destination
from kontinuum.backup.files import DEFAULT_DIRECTORY as BACKUP_DIRECTORY
from kontinuum.backup.files import DEFAULT_KEEP as BACKUP_KEEP
from kontinuum.talos import support
from kontinuum.talos.clusterspec import TALOS_VERSION, is_ip
from kontinuum.talos.renewal import RENEW_BEFORE_DAYS
from kontinuum.talos.waits import WAIT_DEFAULTS
from kontinuum.stackconfig.flux_contract import FLUX
from kontinuum.stackconfig.schema import ANY, Bool, Format, Int, List, Map, Num, Obj, OneOf, Str, without

DEFAULT_KUBERNETES_VERSION = "v1.35.4"
DEFAULT_SERVER_IMAGE = "ghcr.io/kontinuum-sh/kontinuum-server:latest"
LETSENCRYPT = "https://acme-v02.api.letsencrypt.org/directory"
CONTROL_PLANE_POOL = "controlplane"

# Upstream charts by default; the lab stack points these at lab/charts.
DEFAULT_CHARTS = {
    "cilium": {"repo": "https://helm.cilium.io/", "chart": "cilium", "version": "1.18.4", "namespace": "kube-system"},
    "certManager": {"repo": "https://charts.jetstack.io", "chart": "cert-manager", "version": "v1.19.1",
                    "namespace": "cert-manager"},
}
DEFAULT_GATEWAY_API = "https://github.com/kubernetes-sigs/gateway-api/releases/download/v1.3.0/standard-install.yaml"

# Bounds of every wait, in seconds; stack config `timeouts` overrides any of them. Sized for
# real hardware: an installer pull + install to disk + reboot routinely takes several minutes,
# and so does a reset that wipes partitions; the apiserver answers minutes after bootstrap.
# The Talos ones come from kontinuum/talos/waits.py, where the providers' own bounds live.
DEFAULT_TIMEOUTS = {
    "discovery": 10,
    "claim": 0,
    "apply": int(WAIT_DEFAULTS.apply),
    "bootstrap": int(WAIT_DEFAULTS.bootstrap),
    "kubeconfig": int(WAIT_DEFAULTS.kubeconfig),
    "cilium": 600,
    "health": int(WAIT_DEFAULTS.health),
    "certManager": 600,
    "gateway": 300,
    "certificate": 600,
    "registryJoin": 600,
    "flux": 600,
    "teardown": int(WAIT_DEFAULTS.reset),
    "upgrade": 900,
    "kubernetesUpgrade": 300,  # each component of each node, and the bootstrap manifests, in a Kubernetes upgrade (talosctl: 5 min each)
}

# What a reset wipes on teardown (zones[].teardown.wipe). Talos's documented way back to
# maintenance mode wipes the STATE and EPHEMERAL partitions; `disk` wipes the whole system
# disk, which leaves a machine that boots only from the network or an ISO afterwards.
TEARDOWN_WIPES = ("state", "disk")

# How a zone's Gateway is reachable (zones[].ingress.mode; README: Exposure) and how its host
# name gets into DNS (zones[].dns.mode).
INGRESS_MODES = ("hostNetwork", "loadBalancer")
DNS_MODES = ("manual", "rfc2136")

# --- value formats --------------------------------------------------------------------------

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")
_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s.]+$")


def _host_problem(host: str) -> bool:
    """True when `host` is neither an IP literal nor an RFC 1123 host name."""
    return not (is_ip(host) or (_HOST.match(host) and not host.replace(".", "").isdigit()))


def _url_problem(value: str, *, port_required: bool) -> str | None:
    want = "must be https://host:port (e.g. https://10.0.0.5:6443)" if port_required else "must be an https URL"
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return f"{want} with a port between 1 and 65535"
    if parts.scheme != "https" or not parts.hostname or _host_problem(parts.hostname):
        return want
    if port_required and (port is None or parts.path not in ("", "/") or parts.query or parts.fragment):
        return want
    if port is not None and not 0 < port < 65536:
        return f"{want} with a port between 1 and 65535"
    return None


def _host_port_problem(value: str) -> str | None:
    want = "must be host:port with a numeric port (no scheme), e.g. hub.example.com:443"
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if "://" in value or not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host or _host_problem(host):
        return want
    return None


NAME = Format("name", lambda v: None if _NAME.match(v) else
              "must be lowercase letters, digits and '-', at most 32 characters", _NAME.pattern)
ADDRESS = Format("address", lambda v: "must be an IPv4/IPv6 address or an RFC 1123 host name"
                 if _host_problem(v) else None)
ENDPOINT = Format("https://host:port", lambda v: _url_problem(v, port_required=True), r"^https://[^/]+:[0-9]{1,5}/?$")
HTTPS_URL = Format("https URL", lambda v: _url_problem(v, port_required=False), r"^https://")
EMAIL = Format("e-mail", lambda v: None if _EMAIL.match(v) else "must be an e-mail address", _EMAIL.pattern)
DNS_NAME = Format("DNS name", lambda v: "must be a DNS name" if not _HOST.match(v) or is_ip(v) else None,
                  _HOST.pattern)
HOST_PORT = Format("host:port", _host_port_problem, r"^[^:/]+:[0-9]{1,5}$|^\[[0-9a-fA-F:]+\]:[0-9]{1,5}$")
VERSION = Format("version", lambda v: None if re.match(r"^v\d+\.\d+\.\d+$", v) else "must look like v1.2.3",
                 r"^v\d+\.\d+\.\d+$")
DEVICE = Format("device path", lambda v: None if re.match(r"^/dev/\S+$", v) else
                "must be a device path like /dev/sda", r"^/dev/\S+$")
def _block_problem(value: str) -> str | None:
    """A CIDR (`192.0.2.0/28`) or an inclusive range (`192.0.2.10-192.0.2.20`) of one family."""
    want = "must be a CIDR (192.0.2.0/28) or a range first-last (192.0.2.10-192.0.2.20)"
    try:
        if "/" in value:
            ipaddress.ip_network(value, strict=True)
            return None
        first, sep, last = value.partition("-")
        a, b = ipaddress.ip_address(first.strip()), ipaddress.ip_address(last.strip() if sep else first.strip())
    except ValueError as e:
        return f"{want} ({e})" if "/" in value and "host bits" in str(e) else want
    if a.version != b.version:
        return f"{want}: both ends of one address family"
    if a > b:
        return f"{want}: the first address comes after the last"
    return None


def _regex_problem(value: str) -> str | None:
    try:
        re.compile(value)
    except re.error as e:
        return f"must be a regular expression ({e})"
    return None


def _pem_problem(value: str) -> str | None:
    from cryptography import x509

    try:
        x509.load_pem_x509_certificates(value.encode())
    except ValueError:
        return "must be PEM certificates (-----BEGIN CERTIFICATE-----)"
    return None


POOL_BLOCK = Format("CIDR or range", _block_problem, r"^[0-9A-Fa-f.:]+(/[0-9]{1,3}|-[0-9A-Fa-f.:]+)?$")
IP = Format("IP address", lambda v: None if is_ip(v) else "must be an IPv4 or IPv6 address", r"^[0-9A-Fa-f.:]+$")
REGEX = Format("regular expression", _regex_problem)
PEM = Format("PEM", _pem_problem, r"-----BEGIN CERTIFICATE-----")
DNS_SERVER = Format("host[:port]", lambda v: None if not _host_problem(v) else _host_port_problem(v) and
                    "must be an address or host name, optionally with :port (53 by default)")
NON_EMPTY = Format("string", lambda v: "must not be empty" if not v.strip() else None, r"\S")
BACKUP_DESTINATION = Format("folder or s3:// URL", backup_destination.problem, r"\S")
DEFAULT_INSTALLER = "ghcr.io/siderolabs/installer"
REPOSITORY = Format("image repository", lambda v: None if re.match(r"^[^\s:@]+(:\d+)?(/[^\s:@]+)+$", v) else
                    "must be an image repository without tag or digest (the talosVersion is the tag), e.g. "
                    "factory.talos.dev/metal-installer/<schematic id>", r"^[^\s:@]+(:\d+)?(/[^\s:@]+)+$")
IMAGE = Format("image", lambda v: None if re.match(r"^\S+$", v) else "must be an image reference", r"^\S+$")

# --- the contract ---------------------------------------------------------------------------

PATCH_OP = Obj({
    "op": Str("add, remove, replace, move, copy or test", required=True,
              enum=("add", "remove", "replace", "move", "copy", "test")),
    "path": Str("JSON pointer", required=True),
    "value": ANY,
    "from": Str("JSON pointer (move, copy)"),
})
PATCHES = List(OneOf(Map(ANY), List(PATCH_OP), Str(format=NON_EMPTY), expand=False),
               "machine config patches: RFC 6902 operation lists, YAML merge patch mappings or YAML text of either "
               "(applied cluster → pool → node)")
LABELS = Map(Str(), "node labels, `label: value`")


def _pool(*, control_plane: bool) -> dict:
    replicas = (Int("control planes: 1, 3 or 5", default=1, enum=(1, 3, 5)) if control_plane else
                Int("machines of this pool to claim (at most as many as listed for it)", default=1, minimum=0))
    return {
        "replicas": replicas,
        "installDisk": Str("system disk Talos installs to", default="/dev/sda", format=DEVICE),
        "nodeLabels": LABELS,
        "patches": PATCHES,
    }


CHART = Obj({
    "repo": Str("Helm repository URL", format=NON_EMPTY),
    "chart": Str("chart name", format=NON_EMPTY),
    "version": Str("chart version", format=NON_EMPTY),
    "path": Str("a local chart directory instead of repo/chart/version", format=NON_EMPTY),
    "namespace": Str("namespace of the release", format=NON_EMPTY),
}, "`{repo, chart, version}` or `{path}` of a local chart (either with `namespace`); upstream charts by default",
    expand=False)


def _addon(name: str):
    return Obj({"chart": CHART, "values": Map(ANY, "extra Helm values, merged over the Talos-guide values")},
               f"the {name} release")


INGRESS = Obj({
    "mode": Str("`hostNetwork`: Envoy listens on the nodes' own addresses at ports 80 and 443 (Cilium's Gateway API "
                "host-network mode); `loadBalancer`: the Gateway gets an address from an LB-IPAM pool, announced by "
                "ARP (README: Exposure)", default="hostNetwork", enum=INGRESS_MODES),
    "nodeSelector": Map(Str(), "hostNetwork: labels of the nodes that serve the Gateway (its addresses are their "
                               "InternalIPs); empty: every node"),
    "addresses": List(Str(format=POOL_BLOCK), "loadBalancer: free addresses on the nodes' network for the zone's "
                      "Gateway (CIDRs or first-last ranges), a pool only it uses; without them the Gateway waits for "
                      "an address from a pool you run yourself"),
    "interfaces": List(Str(format=REGEX), "loadBalancer: node interfaces (regular expressions, e.g. `^eth[0-9]+`) "
                       "on which the addresses are announced; empty: every interface Cilium manages"),
    "address": Str("loadBalancer: the Gateway's fixed address, inside `addresses`", format=IP),
}, "how the zone's Gateway (and so `<zone>.<region>.<dnsDomain>`) is reachable")

DNS = Obj({
    "mode": Str("`manual`: the outputs list the record to create (and the update warns); `rfc2136`: the record is "
                "created and deleted with the zone by a TSIG-signed dynamic update", default="manual", enum=DNS_MODES),
    "server": Str("rfc2136: the primary server that takes the updates, `host` or `host:port`", format=DNS_SERVER),
    "zone": Str("rfc2136: the DNS zone to update", format=DNS_NAME, doc_default="`hub.dnsDomain`"),
    "keyName": Str("rfc2136: name of the TSIG key in `kontinuum:dnsTsigKeys`", format=DNS_NAME),
    "ttl": Int("TTL of the record, seconds", default=300, minimum=1, maximum=2147483647),
}, "the DNS record `<zone>.<region>.<dnsDomain>` → the Gateway's addresses (README: DNS)")

MACHINE = Obj({
    "address": Str("the machine's address", format=ADDRESS),
    "addresses": List(Str(format=ADDRESS), "all of the machine's addresses; the first that answers is used"),
    "pool": Str("`controlplane` or a worker pool name", default=CONTROL_PLANE_POOL, format=NAME),
    "lost": Bool("the machine is gone for good (dead disk or power supply, pulled from the rack): it is never called "
                 "again; its etcd member is removed through a healthy control plane, its Node deleted, its claim "
                 "released, its Instance marked lost; reset if it ever answers again (README: Lost machines)",
                 default=False),
})

ZONE = Obj({
    "zone": Str("zone name; every zone object is `<region>-<zone>`", required=True, format=NAME),
    "talosAddresses": List(
        OneOf(Str(format=ADDRESS), MACHINE),
        "machines in maintenance mode: an address, or `{address | addresses: [...], pool, lost}`. Each machine becomes "
        "the hub Instance `<region>-<zone>-<sha256(first address)[:8]>`; an address is used once per stack",
        required=True),
    "controlPlane": Obj({
        **_pool(control_plane=True),
        "endpoint": Str("`https://host:port` in front of the control planes; required for 3 or 5, "
                        "defaults to the first member for 1", format=ENDPOINT),
    }, "the control-plane pool"),
    "workers": List(Obj({"name": Str("pool name", required=True, format=NAME), **_pool(control_plane=False)}),
                    "worker pools"),
    "patches": PATCHES,
    "talosVersion": Str("Talos version (the pinned contract's minor)", default=TALOS_VERSION, format=VERSION),
    "kubernetesVersion": Str(f"Kubernetes version, one the Talos version supports ({support.matrix_text()})",
                             default=DEFAULT_KUBERNETES_VERSION, format=VERSION),
    "addons": Obj({
        "cilium": _addon("Cilium"),
        "certManager": _addon("cert-manager"),
        "gatewayApi": Obj({"source": Str(
            "the Gateway API standard CRDs: a local file, a directory of `*.yaml`, or an http(s) URL (fetched once, "
            "bounded to 30 s, cached in `~/.cache/kontinuum/manifests/`)", format=NON_EMPTY,
            doc_default="v1.3.0 release")}),
    }, "what every zone cluster gets"),
    "ingress": INGRESS,
    "dns": DNS,
    "upgrade": Obj({
        "drain": Bool("cordon and drain each worker's Node before its Talos upgrade, uncordon after",
                      default=True),
        "drainControlPlanes": Bool("also cordon and drain control planes before their upgrade", default=False),
        "allowDowngrade": Bool("allow a talosVersion older than the one a node runs (within Talos's bounds)",
                               default=False),
        "installerImage": Str("installer image repository (an Image Factory one for extensions); the tag is "
                              "`talosVersion`", default=DEFAULT_INSTALLER, format=REPOSITORY),
    }, "how a changed `talosVersion` rolls out: one node at a time, control planes first, etcd healthy before "
       "each control plane, each node verified on the new version"),
    "rollout": Obj({
        "maxUnavailable": Int("worker nodes of a pool that may reboot at the same time for a config change",
                              default=1, minimum=1),
    }, "how a config change that Talos applies only with a reboot rolls out (each node is asked first by a dry "
       "run; live changes reach every node at once): control planes one at a time with etcd healthy before each, "
       "then each worker pool `maxUnavailable` nodes at a time; each node cordoned and drained as `upgrade.drain` "
       "and `upgrade.drainControlPlanes` say, and the next one waits until it is ready again (Talos machine status, "
       "Node Ready with its new boot id, its Cilium agent, on a control plane its static pods and etcd)"),
    "flux": FLUX,
    "serverImage": Str("kontinuum-server image of the zone footprint", default=DEFAULT_SERVER_IMAGE, format=IMAGE),
    "unregisterInstancesOnDelete": Bool("on teardown also delete the hub Instances (default: only release them)",
                                        default=False),
    "teardown": Obj({
        "skipUnreachableCluster": Bool("escape hatch for a dead zone cluster (README: Teardown)", default=False),
        "wipe": Str("what a reset wipes when a machine leaves the zone: `state` (the STATE and EPHEMERAL "
                    "partitions) or `disk` (the whole system disk)", default="state", enum=TEARDOWN_WIPES),
    }),
    "timeouts": Obj({k: Num(f"seconds for the {k} wait", default=v, minimum=0) for k, v in DEFAULT_TIMEOUTS.items()},
                    "seconds for each wait: " + ", ".join(f"`{k}` ({v})" for k, v in DEFAULT_TIMEOUTS.items())
                    + "; `claim: 0` fails at once when no machine is free. Sized for real hardware (installer pull, "
                    "install and reboot take minutes); the lab stack sets short ones", expand=False),
    "talosPort": Int("Talos API port", default=50000, minimum=1, maximum=65535),
    "certificates": Obj({
        "renewBefore": Num("days before expiry at which `pulumi up` renews the admin talosconfig and kubeconfig "
                           "and the backup talosconfig (issued locally from the zone's CAs; no node is touched)",
                           default=RENEW_BEFORE_DAYS, minimum=0),
        "rotate": Obj({
            "talos": Str("token of the Talos API CA rotation; changing it starts one"),
            "kubernetes": Str("token of the Kubernetes CA rotation; changing it starts one"),
        }, "CA rotation, as `talosctl rotate-ca` does it: change a token (any string, e.g. a date) and the next "
           "`pulumi up` generates a new CA (a Pulumi secret in the secrets bundle) and takes every node, one at a "
           "time and without reboots, through: new CA accepted, nodes rolled with the new CA issuing (old one still "
           "accepted), clients switched (talosconfig, kubeconfig, the zone's Kubernetes provider), old CA dropped. "
           "The preview lists the phases; a killed up resumes where the nodes are. A token a zone is created "
           "with rotates nothing, nor does the first token set on a zone made before CA rotation existed (set it, "
           "up, then change it); change a token again only after its rotation finished"),
    }, "client certificates the stack holds; their expiry is exported per zone (`talosconfigExpires`, "
       "`kubeconfigExpires`)"),
    "backup": Obj({
        "onUp": Bool("take an etcd snapshot on every `pulumi up` (the zone's EtcdBackup resource then updates on "
                     "every run); `python -m kontinuum backup` takes one on demand either way", default=False),
        "destination": Str("where the encrypted snapshot files go: a folder (relative to the project folder) or an "
                           "S3-compatible bucket, `s3://<bucket>[/<prefix>]?endpoint=<URL>&use_path_style=true&"
                           "region=<region>` (the parameters of the state backend's URL; credentials from the "
                           "standard AWS environment variables or profile, never from the URL); files go to "
                           "`<destination>/<stack>/<region>-<zone>/` (README: etcd backup and restore)",
                           default=BACKUP_DIRECTORY, format=BACKUP_DESTINATION),
        "directory": Str("older name of `destination` for a folder; give one of the two", format=NON_EMPTY),
        "keep": Int("newest snapshot files kept per zone (older ones are deleted after each backup)",
                    default=BACKUP_KEEP, minimum=1),
    }, "etcd snapshots of the zone, encrypted with the zone's backup key (a Pulumi secret)"),
})

HUB = Obj({
    "dnsDomain": Str("zone servers are published at `<zone>.<region>.<dnsDomain>`", required=True, format=DNS_NAME),
    "grpcEndpoint": Str("`host:port` of the hub's gRPC endpoint; zones get `grpc://zone@<it>` as storage DSN",
                        required=True, format=HOST_PORT),
    "acme": Obj({
        "email": Str("ACME account e-mail", required=True, format=EMAIL),
        "server": Str("ACME directory URL", default=LETSENCRYPT, format=HTTPS_URL),
        "caBundle": Str("PEM CA certificate(s) that sign a private ACME server's TLS certificate (step-ca, Pebble, "
                        "an internal CA); passed to each zone's ClusterIssuer", format=PEM),
        "caBundleFile": Str("instead of `caBundle`: a file path to read it from (the lab uses this for its "
                            "Pebble)", format=NON_EMPTY),
    }, "ACME account for the zones' certificates", required=True),
    "auth": Obj({
        "mode": Str("mirrored into each zone (a zone is refused when unset: its server would not start)",
                    required=True, enum=("anonymous", "oidc")),
        "oidc": Obj({
            "issuerUrl": Str("OIDC issuer", required=True, format=HTTPS_URL),
            "clientId": Str("OIDC client id", required=True, format=NON_EMPTY),
        }, "OIDC settings when `mode: oidc`"),
    }),
}, "the hub", required=True)

STACK = Obj({
    "region": Str("region name; every zone object is `<region>-<zone>`", required=True, format=NAME),
    "hubKubeconfig": Str("**secret**: kubeconfig of the hub "
                         "(`pulumi config set --secret kontinuum:hubKubeconfig < hub.yaml`)", secret=True),
    "hubKubeconfigFile": Str("instead of `hubKubeconfig`: a file path to read it from (the lab uses this)",
                             format=NON_EMPTY),
    "hub": HUB,
    "dnsTsigKeys": Str("**secret**: TSIG keys for `dns.mode: rfc2136`, as `tsig-keygen` prints them "
                       "(`key \"name\" { algorithm hmac-sha256; secret \"…\"; };`, several allowed): "
                       "`pulumi config set --secret kontinuum:dnsTsigKeys < tsig.key`", secret=True),
    "defaults": without(ZONE, "zone", "talosAddresses",
                        doc="any zone key except `zone` and `talosAddresses`; merged under every zone (the zone "
                            "wins; lists are replaced)", expand=False),
    "zones": List(ZONE, "the zones of this region", default=[]),
    "allowEmptyRegion": Bool("let `pulumi up` remove every zone of a deployed region (normally refused: "
                             "`pulumi destroy` removes a region)", default=False),
})

NAMESPACE = "kontinuum"
