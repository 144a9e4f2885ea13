"""Real processes for kwok-played pods: a container's binary runs while its pod is Ready.

kwok plays the kubelets, so a pod runs nothing; for the few components whose behaviour the tests
need for real (the Flux Operator, Flux's source- and kustomize-controller), a PodProcess runs the
binary (tools/install.sh) while a matching pod is Running and Ready, as its container would:
- its API address comes from the pod's own environment (lab/pod_api.py: KubePrism, the Service
  dataplane or a black hole), written into a kubeconfig with the cluster CA the pod would mount
  (ConfigMap kube-root-ca.crt) and the TLS name it asked for;
- its identity is the pod's service account, through a token bound to the pod (TokenRequest, as
  the kubelet's projected token; renewed at half its life), so RBAC is the real one;
- a process that exits is reported as the kubelet reports a container's exit (Ready false,
  CrashLoopBackOff, the exit code in lastState, a message only with terminationMessagePolicy
  FallbackToLogsOnError: the log's tail) and started again after a back-off, then reported
  running; a new pod (another uid) gets a new process; no running pod, no process.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable

import yaml
from kubernetes import client

from lab import api_json, pod_api
from lab.process import Managed
from lab.standins.loop import REQUEST_TIMEOUT

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
        node = json.loads(core.read_node(pod["spec"]["nodeName"], _preload_content=False,
                                         _request_timeout=REQUEST_TIMEOUT).data)
        machine = pod_api.machine_address(node) or pod.get("status", {}).get("hostIP")
        return pod_api.resolve(pod, machine=machine, service=(svc.spec.cluster_ip, svc.spec.ports[0].port),
                               dataplane=pod_api.dataplane_on(node, self.kube_proxy), black_hole=self.black_hole)

    def close(self) -> None:
        self.black_hole.close()


def _ready(pod: dict) -> bool:
    return (not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") == "Running"
            and api_json.is_ready(pod))


def _alive(pod: dict) -> bool:
    """Running, Ready or not (a crash-looping container's pod is still ours)."""
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") == "Running"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def container_status(pod: dict, *, running: bool, restarts: int, exit_code: int | None = None,
                     log_tail: str = "") -> dict:
    """The status patch a kubelet writes for the pod's first container: running again, or exited
    and backing off (message: the log's tail only with FallbackToLogsOnError, as the kubelet)."""
    c = pod["spec"]["containers"][0]
    now = _now()
    old = next((s for s in (pod.get("status") or {}).get("containerStatuses") or [] if s.get("name") == c["name"]), {})
    cs = {"name": c["name"], "image": c.get("image", ""), "imageID": old.get("imageID", ""), "ready": running,
          "restartCount": restarts, "started": running}
    if running:
        cs["state"] = {"running": {"startedAt": now}}
        cs["lastState"] = old.get("lastState") or {}
    else:
        term = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error", "startedAt":
                (old.get("state") or {}).get("running", {}).get("startedAt", now), "finishedAt": now}
        if c.get("terminationMessagePolicy") == "FallbackToLogsOnError" and exit_code and log_tail:
            term["message"] = log_tail[-2048:]
        cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}}
        cs["lastState"] = {"terminated": term}
    ready = "True" if running else "False"
    conditions = [{"type": t, "status": ready, "lastTransitionTime": now} for t in ("ContainersReady", "Ready")]
    return {"status": {"containerStatuses": [cs], "conditions": conditions}}


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
        self.restarts = 0  # of the current pod's container

    def reconcile(self, core: client.CoreV1Api, pods: list[dict]) -> None:
        """One pass over the cluster's pods (the pass's one list, API JSON)."""
        pods = [p for p in pods if api_json.matches(p, self.selector)]
        running = next((p for p in pods if p["metadata"]["uid"] == self.pod_uid and _alive(p)), None) or \
            next((p for p in pods if _ready(p)), None)
        if running is None or running["metadata"]["uid"] != self.pod_uid:
            if self.process is not None:
                log.info("cluster %s: %s pod gone, replaced or not running; stopping its process", self.cluster,
                         self.name)
                self.stop()
            if running is None:
                return
        if self.process is not None and not self.process.running():
            code = self.process.popen.returncode
            log.warning("cluster %s: %s exited (code %s); starting it again in %.0f s. Last lines:\n%s", self.cluster,
                        self.name, code, RESTART_BACKOFF, self.process.tail())
            self._report(core, running, running=False, exit_code=code, log_tail=self.process.tail(80))
            self.process, self._retry_at = None, time.monotonic() + RESTART_BACKOFF
        if self.process is None and time.monotonic() >= self._retry_at:
            restarted = self.pod_uid == running["metadata"]["uid"]
            self._start(core, running)
            if restarted:
                self._report(core, running, running=True)
        elif self.process is not None and time.monotonic() - self._token_at > TOKEN_SECONDS / 2:
            self._write_token(core, running)

    def _start(self, core: client.CoreV1Api, pod: dict) -> None:
        md = pod["metadata"]
        if self.pod_uid != md["uid"]:
            self.restarts = 0
        self.pod_uid = md["uid"]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.route = self.network.route(core, pod)
        self._write_token(core, pod)
        self._write_kubeconfig(core, md["namespace"])
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(KUBECONFIG=str(self.dir / "kubeconfig"), RUNTIME_NAMESPACE=md["namespace"], **self.env(pod))
        log_path = self.dir / f"{self.name}.log"
        if log_path.exists():  # one log per container run; the last one kept (`kubectl logs --previous`)
            log_path.replace(self.dir / f"{self.name}.previous.log")
        self.process = Managed(self.name, self.argv(pod), log_path, env=env).start()
        log.info("cluster %s: %s running for pod %s/%s; its API address %s is %s (%s)", self.cluster, self.name,
                 md["namespace"], md["name"], self.route.asked, self.route.url, self.route.why)

    def _report(self, core: client.CoreV1Api, pod: dict, *, running: bool, exit_code: int | None = None,
                log_tail: str = "") -> None:
        """Write the container's state into the pod's status, as its kubelet would."""
        if not running:
            self.restarts += 1
        md = pod["metadata"]
        body = container_status(pod, running=running, restarts=self.restarts, exit_code=exit_code, log_tail=log_tail)
        core.patch_namespaced_pod_status(md["name"], md["namespace"], body, _request_timeout=REQUEST_TIMEOUT)

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
