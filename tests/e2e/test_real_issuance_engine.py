"""A zone's certificate through the real parts (issue 16), under the real engine on the lab:
the upstream Cilium and cert-manager charts and Gateway API CRDs at their pins (lab/upstream.py),
real cert-manager (controller + webhook processes against the zone's kube-apiserver), Pebble as
the ACME server with its DNS server, and the lab's Gateway stand-in serving HTTP-01 on the
node's address (host-network mode, the default exposure).

One lab for the module (nodes 127.0.46.11+, hub 127.0.0.46, Pebble 127.0.46.201, its DNS
127.0.46.202); tests run in file order.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes import client

from kontinuum.kube.clients import api_client
from lab.pulumi_cli import ROOT, Stack
from tests.e2e.labs import running_lab

LAB_STACK = ROOT / "stacks" / "Pulumi.lab.yaml"
FIRST = "127.0.46.11"
HUB_ADDRESS = "127.0.0.46"
ACME_ADDRESS = "127.0.46.201"  # its DNS server: 127.0.46.202
NODES = 2
DOMAIN = "kontinuum.test"  # the lab's DNS publishes this domain's zone hosts
REGION = "r16"
TLS_SECRET = ("kontinuum-system", "kontinuum-tls")
TIMEOUTS = {"discovery": 5, "apply": 60, "bootstrap": 60, "kubeconfig": 90, "cilium": 120, "health": 120,
            "certManager": 120, "gateway": 60, "certificate": 120, "registryJoin": 90, "teardown": 60}


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("real-issuance-lab"), nodes=NODES, first_address=FIRST,
                     hub_address=HUB_ADDRESS, acme_address=ACME_ADDRESS) as state:
        yield state


def status(lab: Path) -> dict:
    return json.loads((lab / "status.json").read_text())


def config(lab: Path, *, region: str, domain: str, zones: list[dict], **timeouts) -> dict:
    """stacks/Pulumi.lab.yaml for this lab: its hub, Pebble (directory and CA) and upstream artifacts."""
    cfg = yaml.safe_load(LAB_STACK.read_text())["config"]
    acme = status(lab)["acme"]
    cfg["kontinuum:region"] = region
    cfg["kontinuum:hubKubeconfigFile"] = str(lab / "hub" / "kubeconfig")
    cfg["kontinuum:hub"]["dnsDomain"] = domain
    cfg["kontinuum:hub"]["acme"] = {"email": "ops@kontinuum.test", "server": acme["directory"],
                                    "caBundle": Path(acme["caBundle"]).read_text()}
    addons = cfg["kontinuum:defaults"]["addons"]
    up = lab / "upstream"
    addons["cilium"]["chart"] = {"path": str(up / "cilium")}
    addons["certManager"]["chart"] = {"path": str(up / "cert-manager")}
    addons["gatewayApi"]["source"] = str(up / "gateway-api")
    cfg["kontinuum:defaults"]["timeouts"] = {**TIMEOUTS, **timeouts}
    cfg["kontinuum:zones"] = zones
    return cfg


def new_stack(tmp: Path, name: str, cfg: dict) -> Stack:
    stack = Stack(ROOT, name, tmp / f"{name}-state", passphrase="e2e-issuance", config_file=tmp / f"Pulumi.{name}.yaml",
                  extra_env={"PULUMI_DEBUG_COMMANDS": "true"}).init()  # the engine's --event-log needs it
    stack.write_config_file({"config": cfg})
    return stack


def zone_api(lab: Path, cluster: str) -> client.ApiClient:
    for c in status(lab)["clusters"]:
        if c["name"] == cluster:
            return api_client(Path(c["kubeconfig"]).read_text())
    raise AssertionError(f"no lab cluster {cluster}: {[c['name'] for c in status(lab)['clusters']]}")


def step_seconds(event_log: Path, name_suffix: str) -> float | None:
    """Wall time of the resource step whose URN ends with `name_suffix` (engine event log)."""
    start = end = None
    for line in event_log.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        for kind in ("resourcePreEvent", "resOutputsEvent"):
            urn = ((e.get(kind) or {}).get("metadata") or {}).get("urn", "")
            if urn.endswith(name_suffix):
                if kind == "resourcePreEvent" and start is None:
                    start = e["timestamp"]
                elif kind == "resOutputsEvent":
                    end = e["timestamp"]
    return end - start if start is not None and end is not None else None


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_zone_is_ready_with_a_certificate_pebble_issued_through_the_gateway(lab, tmp_path_factory):
    stack = new_stack(tmp_path_factory.mktemp("issued"), "issued",
                      config(lab, region=REGION, domain=DOMAIN, zones=[{"zone": "a", "talosAddresses": [FIRST]}]))
    events = tmp_path_factory.mktemp("issued-events") / "events.jsonl"
    t0 = time.monotonic()
    stack.up(f"--event-log={events}", timeout=900)
    took = time.monotonic() - t0
    zones = stack.outputs()["zones"]
    assert zones["a"]["ready"] is True and zones["a"]["url"] == f"https://a.{REGION}.{DOMAIN}"

    api = zone_api(lab, f"{REGION}-a")
    secret = client.CoreV1Api(api).read_namespaced_secret(TLS_SECRET[1], TLS_SECRET[0], _request_timeout=15)
    leaf = x509.load_pem_x509_certificates(base64.b64decode(secret.data["tls.crt"]))[0]
    issuer_cn = leaf.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert issuer_cn.startswith("Pebble Intermediate CA"), issuer_cn
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [f"a.{REGION}.{DOMAIN}"]
    # cert-manager wrote it (its annotations), after a real ACME order whose challenge went valid.
    notes = secret.metadata.annotations or {}
    assert notes["cert-manager.io/issuer-kind"] == "ClusterIssuer" and "lab.kontinuum.sh/stand-in" not in notes
    orders = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "acme.cert-manager.io", "v1", TLS_SECRET[0], "orders", _request_timeout=15)["items"]
    assert [o["status"]["state"] for o in orders] == ["valid"]
    assert orders[0]["status"]["url"].startswith(f"https://{ACME_ADDRESS}:14000/")

    pids = status(lab)["pids"]
    cm = {k: round(rss_mib(v)) for k, v in pids.items() if k.startswith(f"{REGION}-a/cert-manager")}
    assert set(cm) == {f"{REGION}-a/cert-manager-controller", f"{REGION}-a/cert-manager-webhook"}, pids
    waits = {w: step_seconds(events, f"{REGION}-a-{w}") for w in ("cert-manager", "certificate-ready")}
    print(f"zone up in {took:.0f} s; waits (s): {waits}; cert-manager RSS MiB: {cm}; "
          f"Pebble RSS MiB: { {k: round(rss_mib(v)) for k, v in pids.items() if k.startswith('acme/')} }")


def test_a_host_that_does_not_resolve_fails_with_cert_managers_reason(lab, tmp_path_factory):
    # The lab's DNS serves kontinuum.test only: nobody publishes this zone's host.
    stack = new_stack(tmp_path_factory.mktemp("unresolved"), "unresolved",
                      config(lab, region="r16x", domain="unpublished.test", certificate=30,
                             zones=[{"zone": "c", "talosAddresses": [f"127.0.46.{int(FIRST.rsplit('.', 1)[1]) + 1}"]}]))
    t0 = time.monotonic()
    out = stack.run("up", "--yes", "--skip-preview", check=False, timeout=900)
    text = (out.stdout or "") + (out.stderr or "")
    assert out.returncode != 0, text[-3000:]
    assert "Certificate kontinuum-system/" in text and "not Ready after 30 s" in text, text[-3000:]
    assert "cert-manager says: Challenge " in text and "c.r16x.unpublished.test" in text, text[-3000:]
    # cert-manager's HTTP-01 self check, through the lab's DNS (Go names the system resolver in
    # the error whatever server it asked; the lab's DNS has no record and no authority for it).
    assert "failed to perform self check GET request 'http://c.r16x.unpublished.test/" in text, text[-3000:]
    assert "lookup c.r16x.unpublished.test" in text, text[-3000:]
    print(f"unresolvable host failed in {time.monotonic() - t0:.0f} s")
