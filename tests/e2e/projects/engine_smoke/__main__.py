"""One dynamic-provider resource and one pulumi-kubernetes ConfigMap on a real apiserver."""

import pulumi
import pulumi_kubernetes as k8s
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider


class Greeting(ResourceProvider):
    def create(self, props):
        return CreateResult(id_=f"greeting-{props['name']}", outs={**props, "text": f"hello {props['name']}"})

    def diff(self, _id, olds, news):
        return DiffResult(changes=olds.get("name") != news.get("name"), replaces=["name"])


class GreetingResource(Resource):
    def __init__(self, name, opts=None):
        super().__init__(Greeting(), name, {"name": name, "text": None}, opts)


config = pulumi.Config()
greeting = GreetingResource("smoke")
provider = k8s.Provider("apiserver", kubeconfig=config.require_secret("kubeconfig"))
cm = k8s.core.v1.ConfigMap(
    "smoke",
    metadata={"name": "engine-smoke", "namespace": "default"},
    data={"greeting": greeting.text},
    opts=pulumi.ResourceOptions(provider=provider),
)
pulumi.export("greeting", greeting.text)
pulumi.export("configmap", cm.metadata["name"])
pulumi.export("nested", {"plain": "shown", "hidden": pulumi.Output.secret("not shown")})
pulumi.export("token", pulumi.Output.secret("s3cr3t"))
