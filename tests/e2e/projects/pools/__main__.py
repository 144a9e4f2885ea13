"""Instances and pools from stack config; the e2e tests shape the config per scenario."""

import pulumi

from providers.instance import Instance
from providers.instance_pool import InstancePool

config = pulumi.Config()
hub = config.require_secret("hubKubeconfig")
port = config.get_int("talosPort") or 50000
instances = [
    Instance(
        i["name"],
        name=i["name"],
        interfaces=i["interfaces"],
        labels=i.get("labels", {}),
        hub_kubeconfig=hub,
        talos_port=port,
        probe_timeout=float(i.get("probeTimeout", 3)),
        unregister_on_delete=bool(i.get("unregister", True)),
    )
    for i in config.require_object("instances")
]
for p in config.get_object("pools") or []:
    pool = InstancePool(
        p["name"],
        pool=p["name"],
        selector=p["selector"],
        replicas=p["replicas"],
        hub_kubeconfig=hub,
        wait_seconds=float(p.get("waitSeconds", 0)),
        opts=pulumi.ResourceOptions(depends_on=instances),
    )
    pulumi.export(p["name"], pool.members)
