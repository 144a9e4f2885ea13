"""What a backup or a restore needs to know about one zone, whoever supplies it (the CLI reads
it from the stack's state, the EtcdBackup resource from its inputs), and the zone's identity
that a backup carries so a restore can refuse another cluster's snapshot."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from kontinuum.backup.errors import BackupError  # noqa: F401 - where callers have always found it
from kontinuum.talos import pki, renewal, secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.talosconfig import APID_PORT


@dataclass(frozen=True)
class Identity:
    cluster_id_sha256: str
    etcd_ca_sha256: str


def identity(secrets_yaml: str) -> Identity:
    bundle = secrets.load(secrets_yaml, check_rsa=False)
    etcd_ca = pki.load_certificate(bundle.etcd.crt)
    from cryptography.hazmat.primitives.serialization import Encoding

    return Identity(hashlib.sha256(bundle.cluster_id.encode()).hexdigest(),
                    hashlib.sha256(etcd_ca.public_bytes(Encoding.DER)).hexdigest())


@dataclass(frozen=True)
class ZoneAccess:
    cluster: str  # <region>-<zone>
    talosconfig: str = field(repr=False)
    secrets_yaml: str = field(repr=False)
    control_planes: tuple[str, ...]
    workers: tuple[str, ...] = ()
    talos_port: int = APID_PORT
    key: str | None = field(default=None, repr=False)  # the zone's backup key (base64)
    backup_talosconfig: str = field(default="", repr=False)  # os:etcd:backup only (credential.py)
    known_identity: Identity | None = None  # a backup kit carries it instead of the secrets bundle (kit.py)

    def client(self, node: str) -> TalosClient:
        """An os:admin client for `node`. A held certificate about to expire (no `pulumi up` renewed
        it in time) is replaced, for this process only, by one issued from the bundle's OS CA."""
        config = talosconfig.parse(self.talosconfig)
        if renewal.due(config.crt, 1):
            fresh = renewal.renew_talosconfig_cert(secrets.load(self.secrets_yaml, check_rsa=False).os)
            config.crt, config.key = fresh.crt, fresh.key
        return TalosClient.from_talosconfig(config, node=node, endpoint=node, port=self.talos_port)

    def backup_client(self, node: str) -> TalosClient:
        """The client a backup uses: the zone's os:etcd:backup certificate, never the admin one."""
        if not self.backup_talosconfig:
            raise BackupError(f"zone {self.cluster}: the stack holds no backup credential (os:etcd:backup) for it "
                              "yet; run `pulumi up` once (the zone's EtcdBackup resource issues it)")
        config = talosconfig.parse(self.backup_talosconfig)
        return TalosClient.from_talosconfig(config, node=node, endpoint=node, port=self.talos_port)

    def identity(self) -> Identity:
        return self.known_identity or identity(self.secrets_yaml)

    def require_key(self) -> str:
        if not self.key:
            raise BackupError(f"zone {self.cluster}: the stack holds no backup key for it yet; run `pulumi up` once "
                              "(it creates the zone's EtcdBackup resource and its key)")
        return self.key
