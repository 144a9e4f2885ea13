"""The typed stack config: what the program and the CLI read once the `kontinuum:` values passed
the whole check (parse.py builds it; the contract in contract.py defines the raw shapes).
Plain frozen dataclasses, so components and providers can take them apart without the parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kontinuum.backup.files import DEFAULT_DIRECTORY as BACKUP_DIRECTORY
from kontinuum.backup.files import DEFAULT_KEEP as BACKUP_KEEP
from kontinuum.stackconfig.contract import DEFAULT_INSTALLER
from kontinuum.stackconfig.exposure import Dns, Ingress
from kontinuum.stackconfig.flux import Flux
from kontinuum.talos.renewal import RENEW_BEFORE_DAYS


@dataclass(frozen=True)
class ChartSource:
    chart: str
    namespace: str
    repo: str | None = None
    version: str | None = None
    path: str | None = None  # a local chart directory instead of repo/chart/version


@dataclass(frozen=True)
class Addon:
    source: ChartSource
    values: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Addons:
    cilium: Addon
    cert_manager: Addon
    gateway_api: str  # URL or local path of the standard-channel CRD bundle


@dataclass(frozen=True)
class Machine:
    addresses: tuple[str, ...]
    pool: str
    lost: bool = False  # gone for good: never called again, its member and Node removed (README: Lost machines)


@dataclass(frozen=True)
class Pool:
    name: str
    replicas: int
    install_disk: str = "/dev/sda"
    node_labels: dict = field(default_factory=dict)
    patches: tuple = ()


@dataclass(frozen=True)
class Backup:
    on_up: bool = False
    destination: str = BACKUP_DIRECTORY  # a folder (relative to the project folder) or an s3:// URL
    keep: int = BACKUP_KEEP


@dataclass(frozen=True)
class Upgrade:
    """How a changed talosVersion rolls out (contract `upgrade`)."""

    drain: bool = True  # workers
    drain_control_planes: bool = False
    allow_downgrade: bool = False
    installer: str = DEFAULT_INSTALLER  # repository; the tag is the Talos version

    def image(self, talos_version: str) -> str:
        return f"{self.installer}:{talos_version}"


@dataclass(frozen=True)
class Zone:
    zone: str
    machines: tuple[Machine, ...]
    control_plane: Pool
    endpoint: str | None
    workers: tuple[Pool, ...]
    talos_version: str
    kubernetes_version: str
    addons: Addons
    patches: tuple
    unregister_instances_on_delete: bool
    server_image: str
    timeouts: dict
    skip_unreachable_cluster: bool  # teardown escape hatch: finish destroy with a dead cluster
    talos_port: int = 50000
    teardown_wipe: str = "state"  # one of TEARDOWN_WIPES
    ingress: Ingress = Ingress()
    dns: Dns = Dns()
    backup: Backup = field(default_factory=Backup)
    renew_before_days: float = RENEW_BEFORE_DAYS
    rotate: dict = field(default_factory=dict)  # certificates.rotate: CA kind -> token
    upgrade: Upgrade = field(default_factory=Upgrade)
    max_unavailable: int = 1  # rollout.maxUnavailable: workers of a pool rebooting at once for a config change
    path: str = "zones[0]"  # where the zone is in the stack config, for errors found later
    flux: Flux | None = None  # the GitOps hand-off, when configured


@dataclass(frozen=True)
class Auth:
    mode: str  # "anonymous" | "oidc"
    oidc_issuer_url: str | None = None
    oidc_client_id: str | None = None


@dataclass(frozen=True)
class Hub:
    dns_domain: str
    grpc_endpoint: str
    acme_email: str
    acme_server: str
    auth: Auth | None
    acme_ca_bundle: str | None = None


@dataclass(frozen=True)
class StackConfig:
    region: str
    hub: Hub
    zones: tuple[Zone, ...]
    zone_index: tuple[int, ...] = ()  # each zone's position in `zones` of the stack config (error paths)
    allow_empty_region: bool = False
    tsig_keys: dict = field(default_factory=dict, repr=False)  # name -> kontinuum.dns.tsig.TsigKey (secret)
