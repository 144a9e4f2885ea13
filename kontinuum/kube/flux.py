"""The Flux hand-off on a zone cluster (seed 002): the bounded calls its providers make on the
objects kontinuum/kube/flux_manifests.py builds.

apply_instance / delete_instance / retire_secrets: server-side apply and a bounded wait for
Ready naming the failing condition; a delete that never hangs on the operator's finalizer.
"""

from __future__ import annotations

import time

from kubernetes import client

from kontinuum.errors import KontinuumError
from kontinuum.kube import flux_teardown
from kontinuum.kube.clients import api_client, describe_error
from kontinuum.kube.flux_manifests import GROUP, INSTANCE_NAME, PLURAL, VERSION

FINALIZER = "fluxcd.controlplane.io/finalizer"
FIELD_MANAGER = "kontinuum"
OPERATOR_SELECTOR = "app.kubernetes.io/name=flux-operator"
REQUEST_TIMEOUT = 15.0
POLL = 3.0


class FluxNotReady(KontinuumError):
    pass


# --- calls -----------------------------------------------------------------------------------


def _custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def _get(api: client.ApiClient, namespace: str) -> dict | None:
    try:
        return _custom(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, INSTANCE_NAME,
                                                         _request_timeout=REQUEST_TIMEOUT)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def readiness(obj: dict | None) -> tuple[bool, str]:
    """(Ready for the current generation, the failing condition in words)."""
    if obj is None:
        return False, "FluxInstance not found"
    status = obj.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conditions.get("Ready")
    generation = obj.get("metadata", {}).get("generation")
    if ready is None:
        return False, "no Ready condition yet (the Flux Operator has not reconciled it)"
    current = ready.get("observedGeneration", status.get("observedGeneration")) in (None, generation)
    text = f"Ready={ready.get('status')} ({ready.get('reason')}): {ready.get('message') or ''}".rstrip(": ")
    if ready.get("status") == "True" and current:
        # The operator's patch helper writes conditions before the rest of the status: Ready can
        # show a moment before lastAppliedRevision does.
        if not status.get("lastAppliedRevision"):
            return False, f"{text} [lastAppliedRevision not written yet]"
        return True, text
    if not current:
        return False, f"{text} [for generation {ready.get('observedGeneration')}, not {generation} yet]"
    for other in ("Stalled", "Reconciling"):
        c = conditions.get(other)
        if c and c.get("status") == "True":
            text += f"; {other} ({c.get('reason')}): {c.get('message') or ''}"
    return False, text


def read_instance(kubeconfig: str, namespace: str) -> dict | None:
    """The live FluxInstance `flux` (None when it is gone), one bounded look."""
    api = api_client(kubeconfig, retries=0)
    try:
        return _get(api, namespace)
    finally:
        api.close()


def api_address_problem(pod: client.V1Pod, service: tuple[str, int] | None) -> str | None:
    """Why a host-network operator pod cannot reach the API before the CNI serves Services: its
    client dials the kubernetes Service ClusterIP (the kubelet's KUBERNETES_SERVICE_HOST/PORT,
    not overridden to Talos KubePrism, localhost:7445). A real kubelet reports only the container's
    exit, so the cause is read from the pod spec."""
    if not pod.spec.host_network or not pod.spec.containers:
        return None
    env = {e.name: e.value for e in pod.spec.containers[0].env or []}
    host = env.get("KUBERNETES_SERVICE_HOST") or (service[0] if service else None)
    port = env.get("KUBERNETES_SERVICE_PORT") or (str(service[1]) if service else None)
    override = "KUBERNETES_SERVICE_HOST" in env
    if host in ("localhost", "127.0.0.1") or (override and service and host != service[0]):
        return None
    return (f"it runs on the host network and its API client dials the kubernetes Service {host}:{port} "
            f"({'set to it' if override else 'injected by the kubelet, not overridden'}), which no node serves "
            "before the CNI (Cilium) is up: a connection that never completes. Its env must name KubePrism: "
            "KUBERNETES_SERVICE_HOST=localhost, KUBERNETES_SERVICE_PORT=7445")


def _service(core: client.CoreV1Api) -> tuple[str, int] | None:
    try:
        svc = core.read_namespaced_service("kubernetes", "default", _request_timeout=REQUEST_TIMEOUT)
        return svc.spec.cluster_ip, svc.spec.ports[0].port
    except Exception:  # noqa: BLE001 - only a detail of the message
        return None


def operator_problem(core: client.CoreV1Api, namespace: str) -> str | None:
    """Why the operator itself is not running (or cannot reach the API), from its pods."""
    pods = core.list_namespaced_pod(namespace, label_selector=OPERATOR_SELECTOR,
                                    _request_timeout=REQUEST_TIMEOUT).items
    if not pods:
        return f"no Flux Operator pod in {namespace}"
    out = []
    service = _service(core) if any(p.spec.host_network for p in pods) else None
    for p in pods:
        ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        restarted = any(cs.restart_count for cs in p.status.container_statuses or [])
        cause = api_address_problem(p, service)
        if ready and not restarted and cause is None:
            return None
        detail = "Ready" if ready else (p.status.phase or "Pending")
        for cs in p.status.container_statuses or []:
            term = (cs.state and cs.state.terminated) or (cs.last_state and cs.last_state.terminated)
            if term is not None:
                detail += f", {cs.name} {term.reason or 'terminated'} (exit code {term.exit_code})"
                detail += f": {term.message.strip()}" if (term.message or "").strip() else ""
            elif cs.state and cs.state.waiting:
                detail += f", {cs.name} {cs.state.waiting.reason}"
            detail += f", restarted {cs.restart_count} times" if cs.restart_count else ""
        if cause is None and (restarted or not ready) and p.spec.host_network:
            env = {e.name: e.value for e in (p.spec.containers[0].env if p.spec.containers else None) or []}
            asked = (env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT"))
            if asked[0] and asked not in (("localhost", "7445"), ("127.0.0.1", "7445")):
                cause = (f"its API address is {env['KUBERNETES_SERVICE_HOST']}:{env.get('KUBERNETES_SERVICE_PORT')} "
                         "(KUBERNETES_SERVICE_HOST/PORT in its env): on Talos it must be KubePrism, localhost:7445")
        out.append(f"pod {p.metadata.name}: {detail}" + (f"; {cause}" if cause else ""))
    return "; ".join(out)


def server_side_apply(api: client.ApiClient, manifest: dict) -> dict:
    """Server-side apply of the FluxInstance as field manager `kontinuum` (fields we stop
    setting, e.g. the suspendApps patch, are removed). The generated client cannot send an
    apply patch, so the call is made directly; JSON is valid apply-patch YAML."""
    md = manifest["metadata"]
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{md['namespace']}/{PLURAL}/{md['name']}"
    return api.call_api(path, "PATCH", query_params=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
                        body=manifest, auth_settings=["BearerToken"], response_type="object",
                        _return_http_data_only=True, _request_timeout=REQUEST_TIMEOUT)


def apply_instance(kubeconfig: str, manifest: dict, *, timeout: float) -> str:
    """Server-side apply, then wait (bounded) for Ready; returns the revision Flux applied."""
    namespace = manifest["metadata"]["namespace"]
    api = api_client(kubeconfig)
    try:
        deadline = time.monotonic() + timeout
        last = "not read yet"
        applied = False
        while True:
            try:
                if not applied:  # the chart's CRDs may still be on their way: retried within the bound
                    try:
                        server_side_apply(api, manifest)
                        applied = True
                    except client.ApiException as e:
                        if e.status != 404:
                            raise
                        raise FluxNotReady("the FluxInstance CRD is not served yet (the operator chart installs it)")
                obj = _get(api, namespace)
                ready, last = readiness(obj)
                if ready:
                    return (obj.get("status") or {}).get("lastAppliedRevision") or ""
                why = operator_problem(client.CoreV1Api(api), namespace)
                if why:
                    last += f"; Flux Operator: {why}"
            except FluxNotReady as e:
                last = str(e)
            except Exception as e:  # noqa: BLE001 - an unreachable apiserver is an observation too
                last = f"cannot read it: {describe_error(e)}"
            if time.monotonic() >= deadline:
                raise FluxNotReady(
                    f"FluxInstance {namespace}/{INSTANCE_NAME} not Ready after {timeout:.0f} s: {last}. Fix what the "
                    "condition names (source URL, credential, operator pod), then run `pulumi up` again.")
            time.sleep(POLL)
    finally:
        api.close()


def delete_instance(kubeconfig: str, namespace: str, *, timeout: float) -> str:
    """Delete the FluxInstance (the operator's finalizer uninstalls Flux) and wait, bounded.
    When the operator does not finalize it in time (not running: a dying zone), the finalizer
    is removed so teardown goes on; the returned note says so."""
    api = api_client(kubeconfig)
    try:
        try:
            _custom(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, INSTANCE_NAME,
                                                         _request_timeout=REQUEST_TIMEOUT)
        except client.ApiException as e:
            if e.status == 404:
                return "already gone"
            raise
        deadline = time.monotonic() + timeout
        released: list[str] = []
        while time.monotonic() < deadline:
            if _get(api, namespace) is None:
                return "uninstalled by the Flux Operator" + _released_note(released)
            try:
                released += flux_teardown.release_orphans(api, namespace)
            except Exception:  # noqa: BLE001 - looked at again on the next poll; the wait stays bounded
                pass
            time.sleep(POLL)
        why = operator_problem(client.CoreV1Api(api), namespace) or "the operator did not finish"
        _custom(api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, INSTANCE_NAME, {"metadata": {"finalizers": None}},
            _request_timeout=REQUEST_TIMEOUT)
        return (f"the Flux Operator did not finalize FluxInstance {namespace}/{INSTANCE_NAME} within {timeout:.0f} s "
                f"({why}); its finalizer was removed so the teardown goes on, Flux controllers may be left behind"
                + _released_note(released))
    finally:
        api.close()


def _released_note(released: list[str]) -> str:
    if not released:
        return ""
    return (f"; Flux's finalizer was removed from {', '.join(released)}, being deleted after the Flux controllers "
            "were gone (nothing else could finalize them)")


def retire_secrets(kubeconfig: str, namespace: str, names: list[str]) -> list[str]:
    """Delete the named Secrets of the namespace; returns those that existed."""
    api = api_client(kubeconfig)
    core = client.CoreV1Api(api)
    deleted = []
    try:
        for name in names:
            try:
                core.delete_namespaced_secret(name, namespace, _request_timeout=REQUEST_TIMEOUT)
                deleted.append(name)
            except client.ApiException as e:
                if e.status != 404:
                    raise
        return deleted
    finally:
        api.close()
