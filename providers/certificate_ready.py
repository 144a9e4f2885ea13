"""CertificateReady: a wait resource whose create blocks (bounded) until a cert-manager
Certificate reports Ready=True (seeds: Installed flips only once the Certificate is Ready, "a
real signal that TLS issuance actually succeeded, not just that the object was created").

check/diff are pure, so `pulumi preview` contacts nothing. A Ready condition counts only for
the Certificate's current generation (cert-manager stamps observedGeneration), so a changed
Certificate waits for its re-issue rather than passing on the old one. `trigger` ties the
wait to the Certificate resource (its uid and generation), so a replaced or edited
Certificate waits again.

The wait logic below is plain Python over the kubernetes client (no Pulumi) and can move to
kontinuum/kube/ unchanged.
"""

from __future__ import annotations

import time

import pulumi
from kubernetes import client
from kubernetes.client.rest import ApiException
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, Resource, ResourceProvider, UpdateResult

from kontinuum.errors import KontinuumError
from kontinuum.kube.clients import api_client, describe_error
from providers.common import diff_inputs, with_secret_outputs

CM_GROUP = "cert-manager.io"
CM_VERSION = "v1"
REQUEST_TIMEOUT = 15.0
UPDATE_ON = ("namespace", "name", "trigger", "kubeconfig")


class CertificateNotReady(KontinuumError):
    """The Certificate did not become Ready within the bound."""


# -- pure -----------------------------------------------------------------------------------


def conditions(obj: dict | None) -> list[dict]:
    return list(((obj or {}).get("status") or {}).get("conditions") or [])


def is_ready(cert: dict) -> bool:
    """Ready=True, and (when cert-manager says which) for the Certificate's current generation."""
    gen = (cert.get("metadata") or {}).get("generation")
    for c in conditions(cert):
        if c.get("type") == "Ready" and c.get("status") == "True":
            observed = c.get("observedGeneration")
            return observed is None or gen is None or observed >= gen
    return False


def describe_conditions(obj: dict | None) -> str:
    """`Ready=False (Reason: message); Issuing=True (...)`, or that there are none."""
    out = []
    gen = ((obj or {}).get("metadata") or {}).get("generation")
    for c in conditions(obj):
        detail = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
        stale = ""
        if c.get("observedGeneration") is not None and gen is not None and c["observedGeneration"] < gen:
            stale = f" [for generation {c['observedGeneration']}, Certificate is at {gen}]"
        out.append(f"{c.get('type')}={c.get('status')}" + (f" ({detail})" if detail else "") + stale)
    return "; ".join(out) or "no conditions yet (cert-manager has not looked at it: is cert-manager running?)"


def issuer_of(cert: dict | None) -> tuple[str, str]:
    ref = ((cert or {}).get("spec") or {}).get("issuerRef") or {}
    return ref.get("kind") or "Issuer", ref.get("name") or "?"


def timeout_message(namespace: str, name: str, timeout: float, last: str, cert: dict | None,
                    issuer_state: str | None, gateway: str | None) -> str:
    kind, issuer = issuer_of(cert)
    where = f"{kind} {issuer}" + (f" (now: {issuer_state})" if issuer_state else "")
    gw = f"Gateway {gateway}" if gateway else "the Gateway"
    return (
        f"Certificate {namespace}/{name} not Ready after {timeout:g} s: {last}. "
        f"Check the {where} (kubectl describe {kind.lower()} {issuer}: is its ACME account registered?), "
        f"{gw}'s HTTP listener on port 80 (cert-manager attaches its HTTP-01 challenge route there; "
        "it must be reachable from the ACME server at http://<host>/.well-known/acme-challenge/) "
        "and that the ACME server itself is reachable; "
        f"kubectl -n {namespace} describe certificate {name} shows the pending Order and Challenge. "
        "Then run `pulumi up` again."
    )


# -- I/O ------------------------------------------------------------------------------------


def _issuer_state(custom: client.CustomObjectsApi, cert: dict | None) -> str | None:
    kind, name = issuer_of(cert)
    try:
        if kind == "ClusterIssuer":
            obj = custom.get_cluster_custom_object(CM_GROUP, CM_VERSION, "clusterissuers", name,
                                                   _request_timeout=REQUEST_TIMEOUT)
        else:
            ns = cert["metadata"]["namespace"]
            obj = custom.get_namespaced_custom_object(CM_GROUP, CM_VERSION, ns, "issuers", name,
                                                      _request_timeout=REQUEST_TIMEOUT)
    except ApiException as e:
        return "does not exist" if e.status == 404 else f"unreadable: HTTP {e.status}"
    except Exception as e:  # noqa: BLE001 - best effort, for the message only
        return f"unreadable: {type(e).__name__}"
    return describe_conditions(obj) if conditions(obj) else "no conditions yet"


def wait_ready(kubeconfig: str, namespace: str, name: str, *, timeout: float, interval: float = 2.0,
               gateway: str | None = None) -> dict:
    """Block (bounded) until Certificate namespace/name is Ready; returns the Certificate object."""
    api = api_client(kubeconfig)
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout
    last, cert = "no observation yet", None
    try:
        while True:
            try:
                cert = custom.get_namespaced_custom_object(CM_GROUP, CM_VERSION, namespace, "certificates", name,
                                                           _request_timeout=REQUEST_TIMEOUT)
                if is_ready(cert):
                    return cert
                last = f"last conditions: {describe_conditions(cert)}"
            except ApiException as e:
                if e.status == 404:
                    cert, last = None, "the Certificate does not exist"
                else:
                    last = f"cannot read the Certificate (HTTP {e.status} {e.reason})"
            except Exception as e:  # noqa: BLE001 - an unreachable apiserver is an observation too
                last = f"cannot read the Certificate ({describe_error(e)})"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CertificateNotReady(timeout_message(namespace, name, timeout, last, cert,
                                                          _issuer_state(custom, cert) if cert else None, gateway))
            time.sleep(min(interval, remaining))
    finally:
        api.close()


def _ready_condition(cert: dict) -> dict:
    return next((c for c in conditions(cert) if c.get("type") == "Ready"), {})


# -- provider -------------------------------------------------------------------------------


class CertificateReadyProvider(ResourceProvider):
    def check(self, _olds, news):
        failures = [CheckFailure(k, "required") for k in ("namespace", "name") if not news.get(k)]
        if not news.get("kubeconfig"):
            failures.append(CheckFailure("kubeconfig", "required: the zone cluster's kubeconfig (secret)"))
        timeout = news.get("timeout")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            failures.append(CheckFailure("timeout", f"must be a number of seconds >= 0, got {timeout!r}"))
        return CheckResult(news, failures)

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=UPDATE_ON)

    def _wait(self, props: dict) -> dict:
        cert = wait_ready(props["kubeconfig"], props["namespace"], props["name"], timeout=float(props["timeout"]),
                          gateway=props.get("gateway") or None)
        status = cert.get("status") or {}
        return {**props, "ready": True, "notAfter": status.get("notAfter"),
                "message": _ready_condition(cert).get("message")}

    def create(self, props):
        return CreateResult(id_=f"{props['namespace']}/{props['name']}", outs=self._wait(props))

    def update(self, _id, _olds, news):
        return UpdateResult(outs=self._wait(news))


class CertificateReady(Resource):
    """Outputs: ready (true), notAfter, message (the Ready condition's)."""

    ready: pulumi.Output[bool]
    notAfter: pulumi.Output[str]
    message: pulumi.Output[str]

    def __init__(self, resource_name: str, *, kubeconfig: pulumi.Input[str], namespace: str, name: str,
                 timeout: float, gateway: str | None = None, trigger: pulumi.Input = None,
                 opts: pulumi.ResourceOptions | None = None):
        """gateway: `namespace/name` of the Gateway serving the Certificate, for the timeout message."""
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "namespace": namespace, "name": name,
                 "timeout": timeout, "gateway": gateway, "trigger": trigger,
                 "ready": None, "notAfter": None, "message": None}
        super().__init__(CertificateReadyProvider(), resource_name, props, with_secret_outputs(opts, "kubeconfig"))
