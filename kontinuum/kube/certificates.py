"""cert-manager Certificate readiness, read with the kubernetes client (no Pulumi).

A Ready condition counts only for the Certificate's current generation (cert-manager stamps
observedGeneration), so a changed Certificate waits for its re-issue rather than passing on
the old one. On timeout the message names what was seen: the Certificate's conditions, its
issuer's state, cert-manager's own reason on each pending ACME Challenge for its names (why
the HTTP-01 self check or the ACME server's validation fails, e.g. a host that does not
resolve), and the Gateway that should serve the HTTP-01 challenge.
"""

from __future__ import annotations

import time

from kubernetes import client
from kubernetes.client.rest import ApiException

from kontinuum.errors import KontinuumError
from kontinuum.kube import watching
from kontinuum.kube.clients import api_client, describe_error

CM_GROUP = "cert-manager.io"
CM_VERSION = "v1"
ACME_GROUP = "acme.cert-manager.io"
REQUEST_TIMEOUT = 15.0


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


def describe_challenges(cert: dict | None, challenges: list[dict]) -> str | None:
    """cert-manager's state and reason for each Challenge of the Certificate's names, or None."""
    names = set(((cert or {}).get("spec") or {}).get("dnsNames") or [])
    out = []
    for ch in sorted(challenges, key=lambda c: (c.get("metadata") or {}).get("name", "")):
        spec, status = ch.get("spec") or {}, ch.get("status") or {}
        if spec.get("dnsName") not in names:
            continue
        state = status.get("state") or "pending"
        reason = status.get("reason") or "no reason given yet"
        out.append(f"Challenge {ch['metadata']['name']} ({spec.get('type', 'HTTP-01')} for {spec['dnsName']}): "
                   f"{state}: {reason}")
    return "; ".join(out) or None


def timeout_message(namespace: str, name: str, timeout: float, last: str, cert: dict | None,
                    issuer_state: str | None, gateway: str | None, challenges: str | None = None) -> str:
    kind, issuer = issuer_of(cert)
    where = f"{kind} {issuer}" + (f" (now: {issuer_state})" if issuer_state else "")
    gw = f"Gateway {gateway}" if gateway else "the Gateway"
    said = f"cert-manager says: {challenges}. " if challenges else ""
    return (
        f"Certificate {namespace}/{name} not Ready after {timeout:g} s: {last}. {said}"
        f"Check the {where} (kubectl describe {kind.lower()} {issuer}: is its ACME account registered?), "
        f"{gw}'s HTTP listener on port 80 (cert-manager attaches its HTTP-01 challenge route there; "
        "it must be reachable from the ACME server at http://<host>/.well-known/acme-challenge/) "
        "and that the ACME server itself is reachable; "
        f"kubectl -n {namespace} describe certificate {name} shows the pending Order and Challenge. "
        "Then run `pulumi up` again."
    )


# -- I/O ------------------------------------------------------------------------------------


def _challenges(custom: client.CustomObjectsApi, cert: dict | None) -> str | None:
    try:
        items = custom.list_namespaced_custom_object(ACME_GROUP, "v1", cert["metadata"]["namespace"], "challenges",
                                                     _request_timeout=REQUEST_TIMEOUT).get("items") or []
    except Exception:  # noqa: BLE001 - best effort, for the message only (no ACME CRDs: no challenges)
        return None
    return describe_challenges(cert, items)


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
    """Block (bounded) until Certificate namespace/name is Ready; returns the Certificate object.
    Looks again as soon as the Certificate changes (a watch), at the latest every `interval`."""
    api = api_client(kubeconfig)
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout
    last, cert = "no observation yet", None
    watched = watching.custom_objects(CM_GROUP, CM_VERSION, "certificates", namespace, name)
    try:
        with watching.Waker((kubeconfig, watched)) as waker:
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
                    raise CertificateNotReady(timeout_message(
                        namespace, name, timeout, last, cert, _issuer_state(custom, cert) if cert else None, gateway,
                        _challenges(custom, cert) if cert else None))
                waker.pause(min(interval, remaining))
    finally:
        api.close()


def ready_condition(cert: dict) -> dict:
    return next((c for c in conditions(cert) if c.get("type") == "Ready"), {})
