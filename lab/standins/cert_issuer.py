"""Certificate issuer (lab stand-in): plays cert-manager's issuing for one zone cluster.

The lab's cert-manager pods are kwok-played and issue nothing, and no ACME server is
reachable, yet the downstream footprint waits for its Certificate to be Ready. This stand-in
marks a Certificate Ready only when what real HTTP-01 issuance through the Gateway API needs
is in place: the issuer its issuerRef names exists, and a Gateway's HTTPS listener terminates
TLS with the Certificate's secretName (so the solver route would have somewhere to attach and
the issued secret somewhere to be served). It then writes the kubernetes.io/tls Secret with a
certificate for the requested names, signed by a throwaway lab CA, and marks the Certificate
Ready with cert-manager's own reason and message. Objects it touches carry the annotation
`lab.kontinuum.sh/stand-in`, so nobody mistakes them for cert-manager's work.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from cryptography import x509
from kubernetes import client

from kontinuum.talos import pki
from lab.standins.loop import REQUEST_TIMEOUT, STANDIN_ANNOTATION, PollingStandin, api_client

CM_GROUP = "cert-manager.io"
CM_VERSION = "v1"
GW_GROUP = "gateway.networking.k8s.io"
GW_VERSION = "v1"

READY_REASON = "Ready"
READY_MESSAGE = "Certificate is up to date and has not expired"
WAITING_REASON = "WaitingForIssuerAndGateway"
ISSUER_READY_REASON = "ACMEAccountRegistered"
ISSUER_READY_MESSAGE = "The ACME account was registered with the ACME server"
STANDIN_NOTE = "issued by the lab certificate issuer (lab stand-in), not by cert-manager"
DEFAULT_DURATION = dt.timedelta(days=90)  # cert-manager's default spec.duration


# -- pure decisions -------------------------------------------------------------------------


def issuer_ref(cert: dict) -> tuple[str, str]:
    """(kind, name) of the Certificate's issuer; cert-manager's default kind is Issuer."""
    ref = cert.get("spec", {}).get("issuerRef") or {}
    return ref.get("kind") or "Issuer", ref.get("name") or ""


def gateway_serves_secret(gateway: dict, namespace: str, secret_name: str) -> bool:
    """True if one of the Gateway's HTTPS/TLS listeners terminates TLS with Secret namespace/secret_name."""
    gw_ns = gateway.get("metadata", {}).get("namespace")
    for listener in gateway.get("spec", {}).get("listeners") or []:
        if listener.get("protocol") not in ("HTTPS", "TLS"):
            continue
        for ref in (listener.get("tls") or {}).get("certificateRefs") or []:
            if (
                ref.get("name") == secret_name
                and (ref.get("kind") or "Secret") == "Secret"
                and (ref.get("group") or "") == ""
                and (ref.get("namespace") or gw_ns) == namespace
            ):
                return True
    return False


def blocker(cert: dict, cluster_issuers: set[str], issuers: set[tuple[str, str]], gateways: list[dict]) -> str | None:
    """Why this Certificate cannot be issued yet, or None when it can."""
    ns = cert["metadata"]["namespace"]
    secret = cert.get("spec", {}).get("secretName")
    kind, name = issuer_ref(cert)
    missing = []
    if not secret:
        return "spec.secretName is empty"
    if kind == "ClusterIssuer":
        if name not in cluster_issuers:
            missing.append(f"ClusterIssuer {name!r}")
    elif kind == "Issuer":
        if (ns, name) not in issuers:
            missing.append(f"Issuer {ns}/{name}")
    else:
        return f"issuerRef.kind {kind!r} is not an issuer this stand-in knows (Issuer, ClusterIssuer)"
    if not any(gateway_serves_secret(g, ns, secret) for g in gateways):
        missing.append(f"a Gateway with an HTTPS listener whose tls.certificateRefs names Secret {ns}/{secret}")
    return f"waiting for {' and '.join(missing)}" if missing else None


def condition(obj: dict, type_: str) -> dict | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def is_current(cert: dict, secret: client.V1Secret | None) -> bool:
    """Ready for the Certificate's current generation, with its Secret still in place."""
    ready = condition(cert, "Ready")
    if not ready or ready.get("status") != "True":
        return False
    if ready.get("observedGeneration") != cert["metadata"].get("generation"):
        return False
    if secret is None or not (secret.data or {}).get("tls.crt"):
        return False
    return (secret.metadata.annotations or {}).get("cert-manager.io/certificate-name") == cert["metadata"]["name"]


def parse_duration(value: str | None) -> dt.timedelta:
    """Go duration strings as cert-manager accepts them (e.g. 2160h, 1h30m); default 90 days."""
    if not value:
        return DEFAULT_DURATION
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", value)
    if not m or not any(m.groups()):
        return DEFAULT_DURATION
    h, mi, s = (int(g or 0) for g in m.groups())
    return dt.timedelta(hours=h, minutes=mi, seconds=s)


def _rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _new_condition(type_: str, status: str, reason: str, message: str, generation: int | None, previous: dict | None) -> dict:
    keep_time = previous is not None and previous.get("status") == status
    c = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": previous["lastTransitionTime"] if keep_time else _rfc3339(pki.utcnow()),
    }
    if generation is not None:
        c["observedGeneration"] = generation
    return c


# -- the loop -------------------------------------------------------------------------------


class CertIssuer(PollingStandin):
    """Certificate issuer (lab stand-in) for one zone cluster."""

    name = "cert-issuer"

    def __init__(self, kubeconfig: str | Path, *, interval: float = 2.0, cluster: str = "zone"):
        super().__init__(interval)
        self.cluster = cluster
        self.api = api_client(kubeconfig)
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self._ca: pki.CertKey | None = None
        self.issued: list[str] = []  # namespace/name of every Certificate issued, in order

    def close(self) -> None:
        self.api.close()

    @property
    def ca(self) -> pki.CertKey:
        if self._ca is None:
            self._ca = pki.new_ca(common_name=f"kontinuum lab stand-in issuer ({self.cluster})", organizations=["kontinuum-lab"])
        return self._ca

    def _list(self, group: str, version: str, plural: str) -> list[dict]:
        try:
            out = self.custom.list_cluster_custom_object(group, version, plural, _request_timeout=REQUEST_TIMEOUT)
        except client.ApiException as e:
            if e.status == 404:  # CRD not installed (yet): nothing of that kind exists
                return []
            raise
        return out.get("items") or []

    def poll(self) -> None:
        certs = self._list(CM_GROUP, CM_VERSION, "certificates")
        cluster_issuers = self._list(CM_GROUP, CM_VERSION, "clusterissuers")
        issuers = self._list(CM_GROUP, CM_VERSION, "issuers")
        for issuer in cluster_issuers + issuers:
            self._mark_issuer_ready(issuer)
        if not certs:
            return
        gateways = self._list(GW_GROUP, GW_VERSION, "gateways")
        ci_names = {i["metadata"]["name"] for i in cluster_issuers}
        i_keys = {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in issuers}
        for cert in certs:
            self._reconcile(cert, ci_names, i_keys, gateways)

    def _mark_issuer_ready(self, issuer: dict) -> None:
        ready = condition(issuer, "Ready")
        gen = issuer["metadata"].get("generation")
        if ready and ready.get("status") == "True" and ready.get("observedGeneration") == gen:
            return
        body = {"status": {"conditions": [
            _new_condition("Ready", "True", ISSUER_READY_REASON, ISSUER_READY_MESSAGE, gen, ready)
        ]}}
        md = issuer["metadata"]
        if "namespace" in md:
            self.custom.patch_namespaced_custom_object_status(
                CM_GROUP, CM_VERSION, md["namespace"], "issuers", md["name"], body, _request_timeout=REQUEST_TIMEOUT
            )
        else:
            self.custom.patch_cluster_custom_object_status(
                CM_GROUP, CM_VERSION, "clusterissuers", md["name"], body, _request_timeout=REQUEST_TIMEOUT
            )
        self.log.info("(lab stand-in) %s: marked %s %s Ready", self.cluster, issuer["kind"], md["name"])

    def _read_secret(self, ns: str, name: str) -> client.V1Secret | None:
        try:
            return self.core.read_namespaced_secret(name, ns, _request_timeout=REQUEST_TIMEOUT)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def _reconcile(self, cert: dict, cluster_issuers: set[str], issuers: set[tuple[str, str]], gateways: list[dict]) -> None:
        md = cert["metadata"]
        ns, name, gen = md["namespace"], md["name"], md.get("generation")
        secret_name = cert.get("spec", {}).get("secretName")
        secret = self._read_secret(ns, secret_name) if secret_name else None
        if is_current(cert, secret):
            return
        why = blocker(cert, cluster_issuers, issuers, gateways)
        if why is not None:
            message = f"(lab stand-in) {why}"
            ready = condition(cert, "Ready")
            if not ready or ready.get("message") != message or ready.get("observedGeneration") != gen:
                self._patch_status(ns, name, {"conditions": [
                    _new_condition("Ready", "False", WAITING_REASON, message, gen, ready)
                ]})
                self.log.info("(lab stand-in) %s: Certificate %s/%s not issued: %s", self.cluster, ns, name, why)
            return
        self._issue(cert, secret)

    def _patch_status(self, ns: str, name: str, status: dict) -> None:
        self.custom.patch_namespaced_custom_object_status(
            CM_GROUP, CM_VERSION, ns, "certificates", name, {"status": status}, _request_timeout=REQUEST_TIMEOUT
        )

    def _issue(self, cert: dict, existing: client.V1Secret | None) -> None:
        md, spec = cert["metadata"], cert.get("spec", {})
        ns, name = md["namespace"], md["name"]
        dns_names = list(spec.get("dnsNames") or [])
        ips = list(spec.get("ipAddresses") or [])
        duration = parse_duration(spec.get("duration"))
        leaf = pki.issue_cert(
            self.ca,
            common_name=spec.get("commonName"),
            dns_names=dns_names,
            ip_addresses=ips,
            server=True,
            client=True,
            days=max(1, round(duration / dt.timedelta(days=1))),
            key_type="ecdsa",
        )
        kind, issuer = issuer_ref(cert)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": spec["secretName"],
                "namespace": ns,
                "labels": {"controller.cert-manager.io/fao": "true"},
                "annotations": {
                    "cert-manager.io/certificate-name": name,
                    "cert-manager.io/issuer-name": issuer,
                    "cert-manager.io/issuer-kind": kind,
                    "cert-manager.io/issuer-group": (spec.get("issuerRef") or {}).get("group") or CM_GROUP,
                    "cert-manager.io/common-name": spec.get("commonName") or "",
                    "cert-manager.io/alt-names": ",".join(dns_names),
                    "cert-manager.io/ip-sans": ",".join(ips),
                    STANDIN_ANNOTATION: STANDIN_NOTE,
                },
            },
            "stringData": {"tls.crt": leaf.crt.decode(), "tls.key": leaf.key.decode(), "ca.crt": self.ca.crt.decode()},
        }
        if existing is None:
            self.core.create_namespaced_secret(ns, secret, _request_timeout=REQUEST_TIMEOUT)
        else:
            secret["metadata"]["resourceVersion"] = existing.metadata.resource_version
            self.core.replace_namespaced_secret(spec["secretName"], ns, secret, _request_timeout=REQUEST_TIMEOUT)
        self.custom.patch_namespaced_custom_object(
            CM_GROUP, CM_VERSION, ns, "certificates", name,
            {"metadata": {"annotations": {STANDIN_ANNOTATION: STANDIN_NOTE}}}, _request_timeout=REQUEST_TIMEOUT,
        )
        x = x509.load_pem_x509_certificate(leaf.crt)
        not_before, not_after = x.not_valid_before_utc, x.not_valid_after_utc
        ready = condition(cert, "Ready")
        self.issued.append(f"{ns}/{name}")  # before Ready shows: a waiter on Ready then sees it here
        self._patch_status(ns, name, {
            "conditions": [_new_condition("Ready", "True", READY_REASON, READY_MESSAGE, md.get("generation"), ready)],
            "notBefore": _rfc3339(not_before),
            "notAfter": _rfc3339(not_after),
            "renewalTime": _rfc3339(not_after - (not_after - not_before) / 3),
            "revision": int(cert.get("status", {}).get("revision") or 0) + 1,
        })
        self.log.info("(lab stand-in) %s: issued Certificate %s/%s into Secret %s (lab CA, not ACME)",
                      self.cluster, ns, name, spec["secretName"])
