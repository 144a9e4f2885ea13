"""EtcdBackup: a zone's backup key (issued once, a secret, never printed), its backup credential
(a talosconfig with the `os:etcd:backup` role only, a secret, reissued within
certificates.renewBefore days of its expiry, after a CA rotation or when the control planes
change) and, with `backup.onUp`, one etcd snapshot per
`pulumi up` (kontinuum/backup/take.py) into the zone's destination (a folder or an S3 bucket).

With onUp the diff always reports a change: every up takes a backup, and a preview says so.
Without it nothing here talks to a node; `python -m kontinuum backup` reads the key and the
credential from this resource's outputs. A failed backup fails the up, naming the zone and every
control plane's problem; the next up tries again. The snapshot is taken with the backup
credential only; the admin talosconfig is not an input.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from kontinuum.backup import credential, sealed
from providers.common import TypedResource, with_secret_outputs
from providers.talos_common import Inputs, info, known

SETTINGS = ("cluster", "stack", "destination", "keep", "onUp", "secretsYaml", "controlPlanes", "talosPort",
            "renewBeforeDays")
SECRET_OUTPUTS = ("key", "secretsYaml", "backupTalosconfig")


def _renew_before(props: dict) -> float:
    value = props.get("renewBeforeDays")
    return float(value) if isinstance(value, (int, float)) else credential.RENEW_BEFORE_DAYS


def _credential(props: dict, held: str | None) -> dict:
    if credential.stale(held, props["secretsYaml"], props["controlPlanes"], _renew_before(props)):
        held = credential.issue(props["cluster"], props["secretsYaml"], props["controlPlanes"])
    from kontinuum.talos import renewal, talosconfig

    return {"backupTalosconfig": held,
            "backupTalosconfigExpires": renewal.rfc3339(renewal.expiry(talosconfig.parse(held).crt))}


def _backup(props: dict, key: str, backup_talosconfig: str) -> dict:
    if not props.get("onUp"):
        return {}
    from kontinuum.backup import store  # the snapshot's clients load where it runs, not in the program
    from kontinuum.backup.take import take
    from kontinuum.backup.zone import ZoneAccess

    access = ZoneAccess(cluster=props["cluster"], talosconfig="", secrets_yaml=props["secretsYaml"],
                        control_planes=tuple(props["controlPlanes"]), talos_port=int(props["talosPort"]), key=key,
                        backup_talosconfig=backup_talosconfig)
    taken = take(access, store.for_zone(props["destination"], props["stack"], props["cluster"]),
                 keep=int(props["keep"]), log=info)
    info(f"etcd backup of {props['cluster']}: {taken.path} ({taken.size} bytes from {taken.node}; "
         f"{len(taken.pruned)} older file(s) removed)")
    return {"lastBackup": taken.path}


def stable_outputs(olds: dict, news: dict) -> list[str]:
    """What an update keeps, so a preview keeps it known (providers/previews.py): the key always
    (issued once), the credential unless it is reissued, the last backup unless one is taken."""
    stable = ["key"]
    if known(news.get("secretsYaml")) and known(news.get("controlPlanes")) and not credential.stale(
            olds.get("backupTalosconfig"), news["secretsYaml"], news["controlPlanes"], _renew_before(news)):
        stable += ["backupTalosconfig", "backupTalosconfigExpires"]
    return stable + ([] if news.get("onUp") else ["lastBackup"])


class EtcdBackupProvider(ResourceProvider):
    def check(self, olds, news):
        inputs = Inputs(news)
        inputs.string("cluster", "the zone's cluster name")
        inputs.string("destination", "the backup destination")
        return inputs.result()

    def diff(self, _id, olds, news):
        changed = [k for k in SETTINGS if olds.get(k) != news.get(k)]
        renew = not changed and known(news.get("secretsYaml")) and known(news.get("controlPlanes")) and \
            credential.stale(olds.get("backupTalosconfig"), news["secretsYaml"], news["controlPlanes"],
                             _renew_before(news))
        return DiffResult(changes=bool(changed) or renew or bool(news.get("onUp")), replaces=[],
                          stables=stable_outputs(olds, news))

    def create(self, props):
        key = sealed.new_key()
        cred = _credential(props, None)
        outs = {**{k: props.get(k) for k in SETTINGS}, "key": key, **cred,
                **_backup(props, key, cred["backupTalosconfig"])}
        return CreateResult(id_=props["cluster"], outs=outs)

    def update(self, _id, olds, news):
        key = olds["key"]  # issued once: every earlier file stays readable
        cred = _credential(news, olds.get("backupTalosconfig"))
        outs = {**{k: news.get(k) for k in SETTINGS}, "key": key, "lastBackup": olds.get("lastBackup"), **cred,
                **_backup(news, key, cred["backupTalosconfig"])}
        return UpdateResult(outs=outs)


class EtcdBackup(TypedResource, module="etcd", name="EtcdBackup"):
    """Outputs: key (secret, base64), backupTalosconfig (secret, os:etcd:backup), its expiry,
    lastBackup (path or s3:// URL of the newest file this resource took)."""

    key: pulumi.Output[str]
    backupTalosconfig: pulumi.Output[str]
    backupTalosconfigExpires: pulumi.Output[str]
    lastBackup: pulumi.Output[str]

    def __init__(self, resource_name: str, *, cluster: str, stack: str, destination: str, keep: int, on_up: bool,
                 secrets_yaml: pulumi.Input[str], control_planes: pulumi.Input[list], talos_port: int,
                 renew_before_days: float = 30.0, opts: pulumi.ResourceOptions | None = None):
        props = {"cluster": cluster, "stack": stack, "destination": destination, "keep": keep, "onUp": on_up,
                 "secretsYaml": pulumi.Output.secret(secrets_yaml), "controlPlanes": control_planes,
                 "talosPort": talos_port, "renewBeforeDays": renew_before_days, "key": None, "lastBackup": None, "backupTalosconfig": None,
                 "backupTalosconfigExpires": None}
        super().__init__(EtcdBackupProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_OUTPUTS))
