"""EtcdBackup: a zone's backup key (issued once, a secret, never printed) and, with
`backup.onUp`, one etcd snapshot per `pulumi up` (kontinuum/backup/take.py).

With onUp the diff always reports a change: every up takes a backup, and a preview says so.
Without it nothing here talks to a node; `python -m kontinuum backup` reads the key from this
resource's outputs. A failed backup fails the up, naming the zone and every control plane's
problem; the next up tries again.
"""

from __future__ import annotations

from pathlib import Path

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from kontinuum.backup import sealed
from providers.common import TypedResource, with_secret_outputs
from providers.talos_common import Inputs, info

SETTINGS = ("cluster", "stack", "directory", "keep", "onUp", "talosconfig", "secretsYaml", "controlPlanes",
            "talosPort")
SECRET_OUTPUTS = ("key", "talosconfig", "secretsYaml")


def _backup(props: dict, key: str) -> dict:
    if not props.get("onUp"):
        return {}
    from kontinuum.backup.take import take  # the snapshot's clients load where it runs, not in the program
    from kontinuum.backup.zone import ZoneAccess

    access = ZoneAccess(cluster=props["cluster"], talosconfig=props["talosconfig"],
                        secrets_yaml=props["secretsYaml"], control_planes=tuple(props["controlPlanes"]),
                        talos_port=int(props["talosPort"]), key=key)
    folder = Path(props["directory"]) / props["stack"] / props["cluster"]
    taken = take(access, folder, keep=int(props["keep"]), log=info)
    info(f"etcd backup of {props['cluster']}: {taken.path} ({taken.size} bytes from {taken.node}; "
         f"{len(taken.pruned)} older file(s) removed)")
    return {"lastBackup": str(taken.path)}


class EtcdBackupProvider(ResourceProvider):
    def check(self, olds, news):
        inputs = Inputs(news)
        inputs.string("cluster", "the zone's cluster name")
        inputs.string("directory", "the backup directory")
        return inputs.result()

    def diff(self, _id, olds, news):
        changed = [k for k in SETTINGS if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed) or bool(news.get("onUp")), replaces=[])

    def create(self, props):
        key = sealed.new_key()
        outs = {**{k: props.get(k) for k in SETTINGS}, "key": key, **_backup(props, key)}
        return CreateResult(id_=props["cluster"], outs=outs)

    def update(self, _id, olds, news):
        key = olds["key"]  # issued once: every earlier file stays readable
        outs = {**{k: news.get(k) for k in SETTINGS}, "key": key, "lastBackup": olds.get("lastBackup"),
                **_backup(news, key)}
        return UpdateResult(outs=outs)


class EtcdBackup(TypedResource, module="etcd", name="EtcdBackup"):
    """Outputs: key (secret, base64), lastBackup (path of the newest file this resource took)."""

    key: pulumi.Output[str]
    lastBackup: pulumi.Output[str]

    def __init__(self, resource_name: str, *, cluster: str, stack: str, directory: str, keep: int, on_up: bool,
                 talosconfig: pulumi.Input[str], secrets_yaml: pulumi.Input[str],
                 control_planes: pulumi.Input[list], talos_port: int, opts: pulumi.ResourceOptions | None = None):
        props = {"cluster": cluster, "stack": stack, "directory": directory, "keep": keep, "onUp": on_up,
                 "talosconfig": pulumi.Output.secret(talosconfig), "secretsYaml": pulumi.Output.secret(secrets_yaml),
                 "controlPlanes": control_planes, "talosPort": talos_port, "key": None, "lastBackup": None}
        super().__init__(EtcdBackupProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_OUTPUTS))
