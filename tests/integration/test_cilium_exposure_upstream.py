"""The exposure's Cilium values, pool and L2 policy against the pinned upstream artifacts:
github.com/cilium/cilium@v1.18.4 (chart values.yaml + values.schema.json, the CRDs), read from
the Go module cache (fetched through the module proxy once)."""

from __future__ import annotations

import json

import pytest
import yaml

from kontinuum.stackconfig.exposure import Ingress
from kontinuum_components import addons, exposure
from lab.standins import cilium_crds

CHART = "install/kubernetes/cilium"
TYPES = {"string": str, "boolean": bool, "integer": int, "object": dict, "array": list, "number": (int, float)}
MODES = {
    "hostNetwork": Ingress(node_selector={"node-role.kontinuum.sh/edge": "true"}),
    "hostNetwork-embedded-envoy": Ingress(),
    "loadBalancer": Ingress(mode="loadBalancer", addresses=("192.0.2.0/28", "192.0.2.40-192.0.2.45"),
                                   interfaces=("^eth[0-9]+",), address="192.0.2.41"),
    "loadBalancer-external-pool": Ingress(mode="loadBalancer"),
}


@pytest.fixture(scope="module")
def module():
    return cilium_crds.module_dir()


def _check(value, schema: dict, path: str, problems: list, defaults=None, in_defaults=True):
    """Every key we set exists in the upstream schema (and values.yaml) with an allowed type."""
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types or []
    if types and not any(t != "null" and isinstance(value, TYPES[t]) and not (t == "integer" and isinstance(value, bool))
                         for t in types):
        problems.append(f"{path}: {value!r} is not {types}")
    if isinstance(value, dict) and "properties" in schema:
        for k, v in value.items():
            sub = schema["properties"].get(k)
            if sub is None:
                if schema.get("additionalProperties") is False or not path.endswith("matchLabels"):
                    problems.append(f"{path}.{k}: not in the upstream schema")
                continue
            here = defaults if isinstance(defaults, dict) else {}
            if in_defaults and k not in here:
                problems.append(f"{path}.{k}: not in the upstream values.yaml")
            _check(v, sub, f"{path}.{k}", problems, here.get(k), in_defaults and not path.endswith("matchLabels"))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_cilium_values_exist_upstream_with_their_types(module, mode):
    schema = json.loads((module / CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((module / CHART / "values.yaml").read_text())
    extra = {"envoy": {"enabled": False}} if "embedded" in mode else {}
    values = addons.cilium_values(single_node=True, extra=extra, ingress=MODES[mode])
    problems: list[str] = []
    _check(values, schema, "values", problems, defaults)
    assert problems == []
    assert values["gatewayAPI"]["gatewayClass"]["create"] == "true"
    caps = values["envoy"]["securityContext"]["capabilities"] if mode.startswith("hostNetwork") else {}
    if mode == "hostNetwork":
        assert caps["keepCapNetBindService"] and "NET_BIND_SERVICE" in caps["envoy"]
        assert set(defaults["envoy"]["securityContext"]["capabilities"]["envoy"]) < set(caps["envoy"])  # kept
    if "embedded" in mode:
        assert "NET_BIND_SERVICE" in values["securityContext"]["capabilities"]["ciliumAgent"]
    if mode == "loadBalancer":
        assert values["l2announcements"] == {"enabled": True} and values["k8sClientRateLimit"]["qps"] >= 10
    if mode == "loadBalancer-external-pool":
        assert "l2announcements" not in values and "hostNetwork" not in values["gatewayAPI"]


def test_pool_and_policy_match_the_upstream_crds(module):
    crds = {c["spec"]["names"]["kind"]: c for c in cilium_crds.crds()}
    ingress = MODES["loadBalancer"]
    for manifest in (exposure.pool_manifest(ingress, {"a": "b"}, "kontinuum-system", "kontinuum"),
                     exposure.l2_policy_manifest(ingress, {"a": "b"}, "kontinuum-system", "kontinuum")):
        crd = crds[manifest["kind"]]
        group, version = manifest["apiVersion"].split("/")
        served = {v["name"]: v for v in crd["spec"]["versions"] if v["served"]}
        assert crd["spec"]["group"] == group and version in served, manifest["apiVersion"]
        problems: list[str] = []
        _check(manifest["spec"], served[version]["schema"]["openAPIV3Schema"]["properties"]["spec"], "spec", problems,
               in_defaults=False)
        assert problems == []
    pool = exposure.pool_manifest(ingress, {}, "ns", "gw")
    assert pool["spec"]["blocks"] == [{"cidr": "192.0.2.0/28"}, {"start": "192.0.2.40", "stop": "192.0.2.45"}]
    assert crds["CiliumLoadBalancerIPPool"]["spec"]["versions"][0]["name"] == "v2"  # stored version in 1.18.4
