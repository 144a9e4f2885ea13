"""Our hub CRDs and stand-in chart are well-formed before any apiserver sees them, and the upstream
CRD sets the lab installs are the pinned releases."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kontinuum.hub import crds as hub_crds
from lab import crds as lab_crds
from lab import upstream

CHARTS = Path(upstream.ROOT) / "lab" / "charts"


def _names(manifests):
    return {m["metadata"]["name"] for m in manifests}


def test_hub_crds_are_kontinuum_sh_v1alpha1_with_real_schemas():
    ms = hub_crds.manifests()
    assert _names(ms) == {"instances.kontinuum.sh", "kontinuums.kontinuum.sh"}
    for m in ms:
        (version,) = m["spec"]["versions"]
        assert m["spec"]["group"] == hub_crds.GROUP and version["name"] == hub_crds.VERSION
        assert m["spec"]["scope"] == "Cluster" and version["subresources"] == {"status": {}}
        schema = version["schema"]["openAPIV3Schema"]
        assert schema["required"] == ["spec"] and schema["properties"]["spec"]["required"]
        assert "x-kubernetes-preserve-unknown-fields" not in str(schema)


def test_gateway_api_crds_are_the_pinned_standard_channel():
    ms = {m["spec"]["names"]["kind"]: m for m in lab_crds.gateway_api()}
    served = {k: [v["name"] for v in m["spec"]["versions"]] for k, m in ms.items()}
    assert served == {
        "GatewayClass": ["v1", "v1beta1"], "Gateway": ["v1", "v1beta1"], "HTTPRoute": ["v1", "v1beta1"],
        "GRPCRoute": ["v1"], "ReferenceGrant": ["v1beta1"],
    }
    for m in ms.values():
        assert m["metadata"]["annotations"]["gateway.networking.k8s.io/channel"] == "standard"
        assert m["metadata"]["annotations"]["gateway.networking.k8s.io/bundle-version"] == upstream.pins()["GATEWAY_API_VERSION"]
        assert sum(v["storage"] for v in m["spec"]["versions"]) == 1


def test_cert_manager_crds_cover_every_kind():
    kinds = {(m["spec"]["group"], m["spec"]["names"]["kind"]) for m in lab_crds.cert_manager()}
    assert kinds == {
        ("cert-manager.io", k) for k in ("Certificate", "CertificateRequest", "Issuer", "ClusterIssuer")
    } | {("acme.cert-manager.io", k) for k in ("Order", "Challenge")}


def test_the_stand_in_chart_is_helm_v3_and_carries_no_webhook_configurations():
    for chart in ("cert-manager-standin",):
        meta = yaml.safe_load((CHARTS / chart / "Chart.yaml").read_text())
        assert meta["apiVersion"] == "v2" and meta["name"] == "cert-manager"
        yaml.safe_load((CHARTS / chart / "values.yaml").read_text())
        for t in (CHARTS / chart / "templates").iterdir():
            text = t.read_text()
            assert "kind: ValidatingWebhookConfiguration" not in text
            assert "kind: MutatingWebhookConfiguration" not in text
            assert len(re.findall(r"\{\{.*?\}\}", text, re.S)) == text.count("{{"), t  # every action closed
