"""Real processes for kwok-played pods: a container's binary runs while its pod is Ready.

kwok plays the kubelets, so a pod runs nothing; for the few components whose behaviour the tests
need for real (the Flux Operator, Flux's source- and kustomize-controller), a PodProcess runs the
binary (tools/install.sh) while a matching pod is Running and Ready, as its container would:
- its API address comes from the pod's own environment (lab/pod_api.py: KubePrism, the Service
  dataplane or a black hole), written into a kubeconfig with the cluster CA the pod would mount
  (ConfigMap kube-root-ca.crt) and the TLS name it asked for;
- its identity is the pod's service account, through a token bound to the pod (TokenRequest, as
  the kubelet's projected token; renewed at half its life), so RBAC is the real one;
- a process that exits is started again after a back-off, as the kubelet restarts a container;
  a new pod (another uid) gets a new process; no Ready pod, no process.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable

import yaml
from kubernetes import client

from lab import pod_api
from lab.process import Managed
from lab.standins.loop import REQUEST_TIMEOUT, list_json

log = logging.getLogger(__name__)

TOKEN_SECONDS = 3600
RESTART_BACKOFF = 10.0  # seconds before an exited container's process starts again

Argv = Callable[[dict], list[str]]  # the pod (API JSON) -> argv


class PodNetwork:
    """What resolve() needs to know of one cluster: its Service address, its black hole."""

    def __init__(self, address: str, kube_proxy: bool) -> None:
        self.black_hole = pod_api.BlackHole(address)
        self.kube_proxy = kube_proxy

    def route(self, core: client.CoreV1Api, pod: dict) -> pod_api.Route:
        svc = core.read_namespaced_service("kubernetes", "default", _request_timeout=REQUEST_TIMEOUT)
        node = core.read_node(pod["spec"]["nodeName"], _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        import json

        node = json.loads(node.data)
        machine = pod_api.machine_address(node) or pod.get("status", {}).get("hostIP")
        return pod_api.resolve(pod, machine=machine, service=(svc.spec.cluster_ip, svc.spec.ports[0].port),
                               dataplane=pod_api.dataplane_on(node, self.kube_proxy), black_hole=self.black_hole)

    def close(self) -> None:
        self.black_hole.close()


def _ready(pod: dict) -> bool:
    st = pod.get("status") or {}
    return (not pod["metadata"].get("deletionTimestamp") and st.get("phase") == "Running"
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []))


class PodProcess:
    """The process of one component (pods matching `selector`), reconciled from the cluster's thread."""

    def __init__(self, name: str, selector: str, workdir: Path, argv: Argv, *, cluster: str,
                 network: PodNetwork, env: Callable[[dict], dict] | None = None) -> None:
        self.name, self.selector, self.argv, self.env = name, selector, argv, env or (lambda pod: {})
        self.dir = Path(workdir) / "pods" / name
        self.cluster, self.network = cluster, network
        self.process: Managed | None = None
        self.pod_uid: str | None = None
        self.route: pod_api.Route | None = None
        self._token_at = 0.0
        self._retry_at = 0.0

    def reconcile(self, core: client.CoreV1Api) -> None:
        pods = list_json(core.list_pod_for_all_namespaces, label_selector=self.selector)
        running = next((p for p in pods if _ready(p)), None)
        if running is None or running["metadata"]["uid"] != self.pod_uid:
            if self.process is not None:
                log.info("cluster %s: %s pod gone, replaced or not running; stopping its process", self.cluster,
                         self.name)
                self.stop()
            if running is None:
                return
        if self.process is not None and not self.process.running():
            log.warning("cluster %s: %s exited (code %s); starting it again in %.0f s. Last lines:\n%s", self.cluster,
                        self.name, self.process.popen.returncode, RESTART_BACKOFF, self.process.tail())
            self.process, self._retry_at = None, time.monotonic() + RESTART_BACKOFF
        if self.process is None and time.monotonic() >= self._retry_at:
            self._start(core, running)
        elif self.process is not None and time.monotonic() - self._token_at > TOKEN_SECONDS / 2:
            self._write_token(core, running)

    def _start(self, core: client.CoreV1Api, pod: dict) -> None:
        md = pod["metadata"]
        self.pod_uid = md["uid"]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.route = self.network.route(core, pod)
        self._write_token(core, pod)
        self._write_kubeconfig(core, md["namespace"])
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(KUBECONFIG=str(self.dir / "kubeconfig"), RUNTIME_NAMESPACE=md["namespace"], **self.env(pod))
        self.process = Managed(self.name, self.argv(pod), self.dir / f"{self.name}.log", env=env).start()
        log.info("cluster %s: %s running for pod %s/%s; its API address %s is %s (%s)", self.cluster, self.name,
                 md["namespace"], md["name"], self.route.asked, self.route.url, self.route.why)

    def _write_token(self, core: client.CoreV1Api, pod: dict) -> None:
        md, spec = pod["metadata"], pod["spec"]
        body = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=TOKEN_SECONDS,
            bound_object_ref=client.V1BoundObjectReference(api_version="v1", kind="Pod", name=md["name"],
                                                           uid=md["uid"])))
        sa = spec.get("serviceAccountName") or "default"
        token = core.create_namespaced_service_account_token(sa, md["namespace"], body,
                                                             _request_timeout=REQUEST_TIMEOUT).status.token
        _write_private(self.dir / "token", token)
        self._token_at = time.monotonic()

    def _write_kubeconfig(self, core: client.CoreV1Api, namespace: str) -> None:
        import base64

        ca = core.read_namespaced_config_map("kube-root-ca.crt", namespace, _request_timeout=REQUEST_TIMEOUT).data["ca.crt"]
        assert self.route is not None
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "pod",
               "clusters": [{"name": "pod", "cluster": {
                   "server": self.route.url, "tls-server-name": self.route.server_name,
                   "certificate-authority-data": base64.b64encode(ca.encode()).decode()}}],
               "users": [{"name": "pod", "user": {"tokenFile": str(self.dir / "token")}}],
               "contexts": [{"name": "pod", "context": {"cluster": "pod", "user": "pod", "namespace": namespace}}]}
        _write_private(self.dir / "kubeconfig", yaml.safe_dump(doc, sort_keys=False))

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        self.process, self.pod_uid, self.route, self._retry_at = None, None, None, 0.0


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)
