"""Real cert-manager in an emulated cluster: the controller and webhook built from
cert-manager's own module (tools/builders/cert-manager, `make tools`) run as processes against
the cluster's real kube-apiserver, in place of the containers of the chart's kwok-played pods.

A process starts once its pod runs (so the chart, its RBAC and its configuration are there
first) and restarts when its pod's spec changes, as a kubelet would:
- the webhook runs with its container's own args (the `$(POD_NAMESPACE)` style references
  expanded as the kubelet does) plus a kubeconfig, serving on the address of the node its pod
  runs on. The kube-apiserver reaches it through its Service as in any cluster: it dials the
  Service's ClusterIP, which the lab's service proxy (lab/service_proxy.py, standing in for
  Cilium's service load-balancing) routes to the pod's address. A kwok-played pod's address is
  reachable only if the pod is on the host network, so
  the lab's stacks set `webhook.hostNetwork` (and a securePort of their own, as upstream asks for
  host-network webhooks); a webhook pod that is not is reported and not started: the apiserver
  could not reach it, and cert-manager's objects are refused, as they would be;
- the controller runs with the chart's ControllerConfiguration (its ConfigMap written to the file
  the pod would mount), the cluster-resource namespace of its pod, and the lab's DNS server for
  its HTTP-01 self check (the zone host names resolve only there).

startupapicheck (lab stand-in for its container): its Job's pod completes only once cert-manager's
API really works, as upstream's check: a dry-run create of a Certificate through the apiserver
(which calls the real webhook) succeeds; the lab then annotates the pod and kwok completes it.
Until then the pod runs, so a wait on cert-manager's pods does not pass before the webhook does.

cainjector (lab stand-in): writes the webhook's CA (`ca.crt` of the Secret a webhook
configuration names in `cert-manager.io/inject-ca-from-secret`) into that configuration's
caBundle, which is what upstream's cainjector does for it; nothing else of cainjector's work is
needed here.
"""

from __future__ import annotations

import base64
import logging
import re
from pathlib import Path

from kubernetes import client

from lab.process import Managed
from lab.standins.loop import REQUEST_TIMEOUT

log = logging.getLogger(__name__)

STARTUPAPICHECK_SELECTOR = "app.kubernetes.io/component=startupapicheck"
API_CHECK_ANNOTATION = "lab.kontinuum.sh/api-check"  # "passed": kwok completes the pod (lab/kwok/stages.yaml)
WEBHOOK_SELECTOR = "app.kubernetes.io/component=webhook,app.kubernetes.io/name=webhook"
CONTROLLER_SELECTOR = "app.kubernetes.io/component=controller,app.kubernetes.io/name=cert-manager"
INJECT_ANNOTATION = "cert-manager.io/inject-ca-from-secret"
CONFIG_FILE = "config.yaml"  # the key of the chart's ConfigMaps, mounted as /var/cert-manager/config/config.yaml


# -- pure -----------------------------------------------------------------------------------


def expand(arg: str, env: dict[str, str]) -> str:
    """$(VAR) references as the kubelet expands them; $$ escapes, unknown ones stay as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


def container_env(pod: client.V1Pod, container: client.V1Container) -> dict[str, str]:
    """Literal values and the pod fields the chart uses (metadata.namespace, metadata.name)."""
    fields = {"metadata.namespace": pod.metadata.namespace, "metadata.name": pod.metadata.name}
    out = {}
    for e in container.env or []:
        if e.value is not None:
            out[e.name] = e.value
        elif e.value_from and e.value_from.field_ref and e.value_from.field_ref.field_path in fields:
            out[e.name] = fields[e.value_from.field_ref.field_path]
    return out


def container_args(pod: client.V1Pod) -> list[str]:
    c = pod.spec.containers[0]
    env = container_env(pod, c)
    return [expand(a, env) for a in (c.args or [])]


def flag(args: list[str], name: str) -> str | None:
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def webhook_argv(pod: client.V1Pod, kubeconfig: Path) -> list[str]:
    """The webhook container's args, served on its node's address; --config is not used here."""
    args = [a for a in container_args(pod) if not a.startswith("--config=")]
    return ["cert-manager-webhook", *args, f"--kubeconfig={kubeconfig}", f"--listen-host={pod.status.host_ip}"]


def controller_argv(pod: client.V1Pod, kubeconfig: Path, config: Path | None, nameservers: list[str]) -> list[str]:
    args = container_args(pod)
    argv = ["cert-manager-controller", f"--kubeconfig={kubeconfig}",
            f"--cluster-resource-namespace={flag(args, 'cluster-resource-namespace') or pod.metadata.namespace}"]
    if flag(args, "v"):
        argv.append(f"--v={flag(args, 'v')}")
    if config is not None:
        argv.append(f"--config={config}")
    if nameservers:
        argv.append(f"--acme-http01-solver-nameservers={','.join(nameservers)}")
    return argv


def config_map_of(pod: client.V1Pod) -> str | None:
    for v in pod.spec.volumes or []:
        if v.config_map is not None:
            return v.config_map.name
    return None


# -- the processes --------------------------------------------------------------------------


class CertManager:
    """cert-manager's controller and webhook for one cluster; reconcile() from the runner's thread."""

    def __init__(self, workdir: Path, kubeconfig: Path, *, cluster: str, nameservers: list[str] | None = None):
        self.workdir = Path(workdir)
        self.kubeconfig = Path(kubeconfig)
        self.cluster = cluster
        self.nameservers = list(nameservers or [])
        self.webhook: Managed | None = None
        self.controller: Managed | None = None
        self._argv: dict[str, list[str]] = {}
        self._said: set[str] = set()

    def processes(self) -> list[Managed]:
        return [p for p in (self.controller, self.webhook) if p is not None]

    def stop(self) -> None:
        for p in self.processes():
            p.stop()
        self.webhook = self.controller = None
        self._argv.clear()

    def reconcile(self, api: client.ApiClient) -> None:
        core = client.CoreV1Api(api)
        wh = self._running_pod(core, WEBHOOK_SELECTOR)
        if wh is not None and not wh.spec.host_network:
            self._say(f"cert-manager webhook pod {wh.metadata.namespace}/{wh.metadata.name} is not on the host "
                      "network: the lab can serve a webhook only on a node address (set the cert-manager values "
                      "webhook.hostNetwork: true and a webhook.securePort); not starting it")
            wh = None
        self.webhook = self._ensure("webhook", self.webhook, webhook_argv(wh, self.kubeconfig) if wh else None)
        ctl = self._running_pod(core, CONTROLLER_SELECTOR)
        argv = None
        if ctl is not None:
            argv = controller_argv(ctl, self.kubeconfig, self._config_file(core, ctl), self.nameservers)
        self.controller = self._ensure("controller", self.controller, argv)
        if wh is not None:
            inject_ca_bundles(api)
            self._startupapicheck(api, core)

    def _startupapicheck(self, api: client.ApiClient, core: client.CoreV1Api) -> None:
        pods = [p for p in core.list_pod_for_all_namespaces(label_selector=STARTUPAPICHECK_SELECTOR,
                                                            _request_timeout=REQUEST_TIMEOUT).items
                if (p.metadata.annotations or {}).get(API_CHECK_ANNOTATION) != "passed" and p.status.phase == "Running"]
        if not pods or not api_check(api, pods[0].metadata.namespace):
            return
        for p in pods:
            core.patch_namespaced_pod(p.metadata.name, p.metadata.namespace,
                                      {"metadata": {"annotations": {API_CHECK_ANNOTATION: "passed"}}},
                                      _request_timeout=REQUEST_TIMEOUT)
            log.info("cluster %s: startupapicheck (lab stand-in): cert-manager's API works; %s/%s completes",
                     self.cluster, p.metadata.namespace, p.metadata.name)

    def _say(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            log.warning("cluster %s: %s", self.cluster, message)

    @staticmethod
    def _running_pod(core: client.CoreV1Api, selector: str) -> client.V1Pod | None:
        pods = core.list_pod_for_all_namespaces(label_selector=selector, _request_timeout=REQUEST_TIMEOUT).items
        running = [p for p in pods if p.status and p.status.phase == "Running" and p.status.host_ip
                   and not p.metadata.deletion_timestamp]
        return min(running, key=lambda p: p.metadata.name) if running else None

    def _config_file(self, core: client.CoreV1Api, pod: client.V1Pod) -> Path | None:
        """The pod's ConfigMap written where the controller reads it (the kubelet's volume mount)."""
        name = config_map_of(pod)
        if name is None:
            return None
        cm = core.read_namespaced_config_map(name, pod.metadata.namespace, _request_timeout=REQUEST_TIMEOUT)
        text = (cm.data or {}).get(CONFIG_FILE)
        if not text:
            return None
        path = self.workdir / "cert-manager" / f"controller-{CONFIG_FILE}"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        return path

    def _ensure(self, name: str, proc: Managed | None, argv: list[str] | None) -> Managed | None:
        if proc is not None and (argv != self._argv.get(name) or not proc.running()):
            if not proc.running():
                log.warning("cluster %s: cert-manager %s exited; restarting. Last lines:\n%s",
                            self.cluster, name, proc.tail())
            proc.stop()
            proc = None
        if proc is None and argv is not None:
            proc = Managed(f"cert-manager-{name}", argv, self.workdir / "logs" / f"cert-manager-{name}.log").start()
            self._argv[name] = argv
            log.info("cluster %s: started cert-manager %s (pid %s)", self.cluster, name, proc.pid)
        return proc


def api_check(api: client.ApiClient, namespace: str) -> bool:
    """upstream's `check api`: a dry-run Certificate create is admitted (webhook included)."""
    body = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"generateName": "lab-api-check-", "namespace": namespace},
            "spec": {"secretName": "lab-api-check", "dnsNames": ["api-check.invalid"],
                     "issuerRef": {"name": "lab-api-check"}}}
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "cert-manager.io", "v1", namespace, "certificates", body, dry_run="All", _request_timeout=REQUEST_TIMEOUT)
        return True
    except client.ApiException as e:
        log.debug("startupapicheck (lab stand-in): not yet: %s", e.reason)
        return False


# -- cainjector (lab stand-in) ---------------------------------------------------------------


def inject_ca_bundles(api: client.ApiClient) -> int:
    """Write the named Secret's ca.crt into every webhook of each annotated configuration; returns
    how many configurations changed."""
    adm = client.AdmissionregistrationV1Api(api)
    core = client.CoreV1Api(api)
    changed = 0
    lists = [
        (adm.list_validating_webhook_configuration, adm.patch_validating_webhook_configuration),
        (adm.list_mutating_webhook_configuration, adm.patch_mutating_webhook_configuration),
    ]
    for lister, patcher in lists:
        for cfg in lister(_request_timeout=REQUEST_TIMEOUT).items:
            ref = (cfg.metadata.annotations or {}).get(INJECT_ANNOTATION)
            if not ref or "/" not in ref:
                continue
            ns, name = ref.split("/", 1)
            try:
                secret = core.read_namespaced_secret(name, ns, _request_timeout=REQUEST_TIMEOUT)
            except client.ApiException as e:
                if e.status == 404:  # the webhook has not written its CA yet
                    continue
                raise
            ca = (secret.data or {}).get("ca.crt")
            if not ca:
                continue
            hooks = cfg.webhooks or []
            if all(h.client_config.ca_bundle == ca for h in hooks):
                continue
            body = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca} for i in range(len(hooks))]
            patcher(cfg.metadata.name, body, _request_timeout=REQUEST_TIMEOUT)
            changed += 1
            log.info("cainjector (lab stand-in): wrote %s's CA into %s (%d bytes)", ref, cfg.metadata.name,
                     len(base64.b64decode(ca)))
    return changed
