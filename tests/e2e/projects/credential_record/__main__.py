"""A zone's credential chain without a zone: TalosSecrets -> CaRotation (no nodes: no rotation is
ever due) -> Reader, which stands for everything that renders from the bundle or talks with the
talosconfig (it changes when what it reads changes, as a ConfigApply does). Stack config:
rotate (mapping), renewBefore (days)."""

import hashlib

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from providers.ca_rotation import CaRotation
from providers.talos_secrets import TalosSecrets


class ReaderProvider(ResourceProvider):
    def diff(self, _id, olds, news):
        return DiffResult(changes=olds.get("read") != news.get("read"))

    def create(self, props):
        return CreateResult(id_="reader", outs=props)

    def update(self, _id, _olds, news):
        return UpdateResult(outs=news)


class Reader(pulumi.dynamic.Resource):
    def __init__(self, name, read):
        super().__init__(ReaderProvider(), name, {"read": read})


config = pulumi.Config()
rotate = config.get_object("rotate") or {}
secrets = TalosSecrets("rec-secrets", cluster_name="rec", endpoints=["127.0.68.1"], rotate=rotate,
                       renew_before_days=config.get_float("renewBefore") or 30)
rotation = CaRotation("rec-ca-rotation", cluster_name="rec", rotate_tokens=rotate, secrets_yaml=secrets.secretsYaml,
                      retiring_yaml=secrets.retiringYaml, talosconfig=secrets.talosconfig, nodes=[],
                      k8s_endpoint="https://127.0.68.1:6443")
digest = pulumi.Output.all(rotation.secretsYaml, rotation.talosconfig).apply(
    lambda both: hashlib.sha256("\n".join(both).encode()).hexdigest())
Reader("rec-reader", digest)
pulumi.export("read", digest)
