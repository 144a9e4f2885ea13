"""A region stand-in for the shared-state backend tests: one dynamic resource whose create and
update take `hold` seconds (so a run holds the stack's lock for that long) and a secret
config value that must come back through the key-file secrets provider."""

import time

import pulumi
from pulumi.dynamic import CreateResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, diff_inputs


class HoldProvider(ResourceProvider):
    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=("generation",))

    def create(self, props):
        time.sleep(float(props["hold"]))
        return CreateResult(id_="hold", outs=props)

    def update(self, _id, _olds, news):
        time.sleep(float(news["hold"]))
        return UpdateResult(outs=news)


class Hold(TypedResource, module="test", name="Hold"):
    def __init__(self, name: str, hold: float, generation: int):
        super().__init__(HoldProvider(), name, {"hold": hold, "generation": generation})


cfg = pulumi.Config()
held = Hold(f"{pulumi.get_stack()}-hold", float(cfg.get("hold") or 0), int(cfg.get("generation") or 1))
pulumi.export("generation", held.generation)
pulumi.export("token", cfg.require_secret("token"))
