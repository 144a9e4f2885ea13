"""Pure decisions of the lab's real cert-manager processes (lab/certmanager.py) and of the zone
DNS records it publishes for Pebble (lab/zone_dns.py)."""

from pathlib import Path

from kubernetes import client

from lab import certmanager as cm
from lab.standins.gateway_model import CiliumConfig
from lab.zone_dns import gateway_records, host_network_ips


def pod(args, *, ns="cert-manager", host_ip="127.0.46.11", volumes=None) -> client.V1Pod:
    env = [client.V1EnvVar(name="POD_NAMESPACE", value_from=client.V1EnvVarSource(
        field_ref=client.V1ObjectFieldSelector(field_path="metadata.namespace")))]
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="p", namespace=ns),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", args=args, env=env)], volumes=volumes),
        status=client.V1PodStatus(host_ip=host_ip))


def test_args_are_expanded_as_the_kubelet_does():
    assert cm.expand("--ns=$(POD_NAMESPACE)", {"POD_NAMESPACE": "cm"}) == "--ns=cm"
    assert cm.expand("$(UNKNOWN) $$(POD_NAMESPACE)", {"POD_NAMESPACE": "cm"}) == "$(UNKNOWN) $(POD_NAMESPACE)"


def test_webhook_runs_its_containers_args_on_its_nodes_address():
    p = pod(["--v=2", "--secure-port=10260", "--dynamic-serving-ca-secret-namespace=$(POD_NAMESPACE)",
             "--config=/var/cert-manager/config/config.yaml"])
    assert cm.webhook_argv(p, Path("/k")) == [
        "cert-manager-webhook", "--v=2", "--secure-port=10260", "--dynamic-serving-ca-secret-namespace=cert-manager",
        "--kubeconfig=/k", "--listen-host=127.0.46.11"]


def test_controller_gets_its_config_file_namespace_and_the_lab_nameserver():
    p = pod(["--v=2", "--cluster-resource-namespace=$(POD_NAMESPACE)", "--leader-election-namespace=kube-system"],
            volumes=[client.V1Volume(name="config", config_map=client.V1ConfigMapVolumeSource(name="cert-manager"))])
    assert cm.config_map_of(p) == "cert-manager"
    assert cm.controller_argv(p, Path("/k"), Path("/c.yaml"), ["127.0.46.202:8053"]) == [
        "cert-manager-controller", "--kubeconfig=/k", "--cluster-resource-namespace=cert-manager", "--v=2",
        "--config=/c.yaml", "--acme-http01-solver-nameservers=127.0.46.202:8053"]


def node(ip, *, ready=True, labels=None) -> dict:
    return {"metadata": {"labels": labels or {}},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


GW = {"spec": {"listeners": [{"name": "http", "port": 80}, {"name": "https", "port": 443, "hostname": "a.lab.test"}]}}


def test_records_follow_where_cilium_makes_the_gateway_reachable():
    cfg = CiliumConfig(gateway_api=True, host_network=True, host_network_nodes={"ingress": "yes"})
    ips = host_network_ips([node("127.0.46.12", labels={"ingress": "yes"}), node("127.0.46.11", labels={"ingress": "yes"}),
                            node("127.0.46.13"), node("127.0.46.14", ready=False, labels={"ingress": "yes"})], cfg)
    assert ips == ["127.0.46.11", "127.0.46.12"]
    assert gateway_records(GW, True, ips) == {"a.lab.test": ips}
    with_status = {**GW, "status": {"addresses": [{"type": "IPAddress", "value": "127.0.46.50"}]}}
    assert gateway_records(with_status, False, []) == {"a.lab.test": ["127.0.46.50"]}
    assert gateway_records(GW, False, ips) == {}  # no exposure: nothing to publish, nothing resolves
