"""DownstreamFootprint: the zone's own kontinuum-server on the zone cluster (seeds, stage 3).

In dependency order: namespace kontinuum-system → kontinuum-env Secret + ConfigMap and the
identity TLS Secret (plus, on the hub, the Secret holding only the identity's public
certificate) → Deployment → Service → ClusterIssuer (ACME HTTP-01 through the Gateway API) →
Gateway (HTTP :80 for the challenge, HTTPS :443 for <zone>.<region>.<domain>) → Certificate →
HTTPRoute → CertificateReady (the Installed gate).

Every manifest comes from a pure builder below returning a plain Kubernetes object (camelCase,
as the API server takes it), so tests can assert or apply them without Pulumi; the component
only wires them. Values that are Pulumi Outputs (the identity's PEMs) pass through the
builders untouched.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from kontinuum.hub import crds as hub_crds
from kontinuum.stackconfig import model
from kontinuum.stackconfig.exposure import Ingress
from kontinuum_components.exposure import Exposure, gateway_addresses
from kontinuum_components.talos_cluster import on_zone_cluster
from providers.certificate_ready import CertificateReady

NAMESPACE = hub_crds.ZONE_NAMESPACE
DEPLOYMENT = hub_crds.ZONE_DEPLOYMENT
ENV = hub_crds.ZONE_ENV
IDENTITY_SECRET = hub_crds.ZONE_IDENTITY_SECRET
SERVICE = "kontinuum"
GATEWAY = "kontinuum"
CERTIFICATE = "kontinuum"
TLS_SECRET = "kontinuum-tls"
HTTPROUTE = "kontinuum"
CLUSTER_ISSUER = "kontinuum-acme"
ACME_ACCOUNT_SECRET = "kontinuum-acme-account"
GATEWAY_CLASS = "cilium"  # from Cilium's chart (gatewayAPI.enabled), never created here
HTTP_PORT = 8080
GRPC_PORT = 9090
IDENTITY_MOUNT = "/var/run/kontinuum/identity"

CM_API = "cert-manager.io/v1"
GW_API = "gateway.networking.k8s.io/v1"

# Env keys beyond the hub contract's ENV_REGION/ENV_ZONE/ENV_ENDPOINT.
ENV_STORAGE = "KONTINUUM_SERVER_STORAGE"
ENV_DNS_DOMAIN = "KONTINUUM_SERVER_DNS_DOMAIN"
ENV_ALLOW_ANONYMOUS = "KONTINUUM_INSECURE_ALLOW_ANONYMOUS"
ENV_OIDC_ISSUER_URL = "KONTINUUM_OIDC_ISSUER_URL"
ENV_OIDC_CLIENT_ID = "KONTINUUM_OIDC_CLIENT_ID"

APP_LABEL = "app.kubernetes.io/name"
APP = "kontinuum-server"
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}  # our own waits gate these; the lab has no Gateway controller
CONFIG_HASH_ANNOTATION = "kontinuum.sh/config-hash"
THUMBPRINT_ANNOTATION = "kontinuum.sh/identity-thumbprint"


# -- pure builders --------------------------------------------------------------------------


def zone_host(region: str, zone: str, hub: model.Hub) -> str:
    """<zone>.<region>.<domain>, where the zone's kontinuum-server is exposed."""
    return f"{zone}.{region}.{hub.dns_domain}"


def zone_url(region: str, zone: str, hub: model.Hub) -> str:
    return f"https://{zone_host(region, zone, hub)}"


def storage_dsn(grpc_endpoint: str) -> str:
    """The zone's storage: the hub's etcd gRPC proxy, authenticated with the zone identity."""
    return f"grpc://zone@{grpc_endpoint}"


def labels(region: str, zone: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "kontinuum", "app.kubernetes.io/managed-by": "kontinuum",
            hub_crds.LABEL_REGION: region, hub_crds.LABEL_ZONE: zone}


def _meta(name: str, region: str, zone: str, *, namespace: str | None = NAMESPACE, annotations: dict | None = None,
          extra_labels: dict | None = None) -> dict:
    md: dict[str, Any] = {"name": name, "labels": {**labels(region, zone), **(extra_labels or {})}}
    if namespace:
        md["namespace"] = namespace
    if annotations:
        md["annotations"] = dict(annotations)
    return md


def env_config(region: str, zone: str, hub: model.Hub) -> tuple[dict[str, str], dict[str, str]]:
    """(kontinuum-env Secret data, kontinuum-env ConfigMap data).

    The auth choice mirrors the hub's own (seeds: without it the server refuses to start):
    anonymous sets KONTINUUM_INSECURE_ALLOW_ANONYMOUS=true; oidc sets the issuer URL and client
    ID (public settings, in the ConfigMap) and an OIDC client secret, should the hub config
    carry one, in the Secret.
    """
    if hub.auth is None:
        raise ValueError("hub.auth is not configured: the zone's kontinuum-server refuses to start without "
                         "the hub's auth choice (anonymous or oidc)")
    secret = {ENV_STORAGE: storage_dsn(hub.grpc_endpoint)}
    cm = {
        hub_crds.ENV_REGION: region,
        hub_crds.ENV_ZONE: zone,
        hub_crds.ENV_ENDPOINT: zone_url(region, zone, hub),
        ENV_DNS_DOMAIN: hub.dns_domain,
    }
    if hub.auth.mode == "anonymous":
        cm[ENV_ALLOW_ANONYMOUS] = "true"
    elif hub.auth.mode == "oidc":
        if not hub.auth.oidc_issuer_url or not hub.auth.oidc_client_id:
            raise ValueError("hub.auth.oidc: issuerUrl and clientId are both required")
        cm[ENV_OIDC_ISSUER_URL] = hub.auth.oidc_issuer_url
        cm[ENV_OIDC_CLIENT_ID] = hub.auth.oidc_client_id
    else:
        raise ValueError(f"hub.auth.mode must be anonymous or oidc, got {hub.auth.mode!r}")
    return secret, cm


def config_hash(secret_data: dict, configmap_data: dict, image: str, thumbprint: str) -> str:
    """Changes whenever the server's environment, image or identity does: rolls the pods, and
    re-triggers the waits that depend on the footprint."""
    doc = json.dumps({"secret": secret_data, "configMap": configmap_data, "image": image, "identity": thumbprint},
                     sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()


def namespace_manifest(region: str, zone: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(NAMESPACE, region, zone, namespace=None)}


def env_secret_manifest(region: str, zone: str, data: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": _meta(ENV, region, zone),
            "stringData": dict(data)}


def env_configmap_manifest(region: str, zone: str, data: dict) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(ENV, region, zone), "data": dict(data)}


def identity_secret_manifest(region: str, zone: str, certificate_pem, private_key_pem) -> dict:
    """The identity's private half, on the zone only: kubernetes.io/tls (tls.crt + tls.key)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": _meta(IDENTITY_SECRET, region, zone),
            "stringData": {"tls.crt": certificate_pem, "tls.key": private_key_pem}}


def hub_identity_secret_manifest(region: str, zone: str, certificate_pem, thumbprint=None) -> dict:
    """On the hub: only the identity's self-signed certificate, never the key (so Opaque, not kubernetes.io/tls)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(hub_crds.hub_identity_secret_name(region, zone), region, zone,
                              namespace=hub_crds.HUB_NAMESPACE,
                              annotations={THUMBPRINT_ANNOTATION: thumbprint} if thumbprint is not None else None),
            "stringData": {hub_crds.HUB_IDENTITY_CERT_KEY: certificate_pem}}


def deployment_manifest(region: str, zone: str, image: str, hash_: Any = None) -> dict:
    selector = {APP_LABEL: APP}
    template_md: dict[str, Any] = {"labels": {**labels(region, zone), **selector}}
    if hash_ is not None:
        template_md["annotations"] = {CONFIG_HASH_ANNOTATION: hash_}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(DEPLOYMENT, region, zone, extra_labels=selector),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": template_md,
                "spec": {
                    "containers": [{
                        "name": "kontinuum",
                        "image": image,
                        "envFrom": [{"secretRef": {"name": ENV}}, {"configMapRef": {"name": ENV}}],
                        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
                                  {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"}],
                        "volumeMounts": [{"name": "identity", "mountPath": IDENTITY_MOUNT, "readOnly": True}],
                    }],
                    "volumes": [{"name": "identity", "secret": {"secretName": IDENTITY_SECRET, "defaultMode": 0o400}}],
                },
            },
        },
    }


def service_manifest(region: str, zone: str) -> dict:
    return {
        # skipAwait: pulumi-kubernetes would otherwise wait ≥10 s for Endpoints; the Certificate
        # and the registry join are the gates that matter.
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(SERVICE, region, zone, annotations=SKIP_AWAIT),
        "spec": {"type": "ClusterIP", "selector": {APP_LABEL: APP},
                 "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                           {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP",
                            "appProtocol": "kubernetes.io/h2c"}]},
    }


def cluster_issuer_spec(hub: model.Hub) -> dict:
    """ACME with the HTTP-01 challenge solved through the Gateway's plain-HTTP listener; a
    private ACME server's CA (hub.acme.caBundle) goes in cert-manager's `acme.caBundle` (base64 PEM)."""
    acme = {
        "server": hub.acme_server,
        "email": hub.acme_email,
        "privateKeySecretRef": {"name": ACME_ACCOUNT_SECRET},
        "solvers": [{"http01": {"gatewayHTTPRoute": {"parentRefs": [
            {"name": GATEWAY, "namespace": NAMESPACE, "kind": "Gateway", "sectionName": "http"}]}}}],
    }
    if hub.acme_ca_bundle:
        acme["caBundle"] = base64.b64encode(hub.acme_ca_bundle.encode()).decode()
    return {"acme": acme}


def cluster_issuer_manifest(region: str, zone: str, hub: model.Hub) -> dict:
    return {"apiVersion": CM_API, "kind": "ClusterIssuer",
            "metadata": _meta(CLUSTER_ISSUER, region, zone, namespace=None, annotations=SKIP_AWAIT),
            "spec": cluster_issuer_spec(hub)}


def gateway_spec(region: str, zone: str, hub: model.Hub, ingress: Ingress | None = None) -> dict:
    """HTTP :80 without hostname (cert-manager's challenge route attaches here, from any
    namespace) and HTTPS :443 for the zone host, terminating TLS with the Certificate's secret;
    a fixed address (ingress.address, loadBalancer mode) in spec.addresses."""
    addresses = gateway_addresses(ingress) if ingress else []
    return {
        **({"addresses": addresses} if addresses else {}),
        "gatewayClassName": GATEWAY_CLASS,
        "listeners": [
            {"name": "http", "protocol": "HTTP", "port": 80, "allowedRoutes": {"namespaces": {"from": "All"}}},
            {"name": "https", "protocol": "HTTPS", "port": 443, "hostname": zone_host(region, zone, hub),
             "tls": {"mode": "Terminate", "certificateRefs": [{"kind": "Secret", "group": "", "name": TLS_SECRET}]},
             "allowedRoutes": {"namespaces": {"from": "Same"}}},
        ],
    }


def gateway_manifest(region: str, zone: str, hub: model.Hub, ingress: Ingress | None = None) -> dict:
    return {"apiVersion": GW_API, "kind": "Gateway", "metadata": _meta(GATEWAY, region, zone, annotations=SKIP_AWAIT),
            "spec": gateway_spec(region, zone, hub, ingress)}


def certificate_spec(region: str, zone: str, hub: model.Hub) -> dict:
    return {"secretName": TLS_SECRET, "dnsNames": [zone_host(region, zone, hub)],
            "issuerRef": {"name": CLUSTER_ISSUER, "kind": "ClusterIssuer", "group": "cert-manager.io"}}


def certificate_manifest(region: str, zone: str, hub: model.Hub) -> dict:
    return {"apiVersion": CM_API, "kind": "Certificate",
            "metadata": _meta(CERTIFICATE, region, zone, annotations=SKIP_AWAIT),
            "spec": certificate_spec(region, zone, hub)}


def httproute_spec(region: str, zone: str, hub: model.Hub) -> dict:
    return {
        "parentRefs": [{"name": GATEWAY, "namespace": NAMESPACE, "sectionName": "https"}],
        "hostnames": [zone_host(region, zone, hub)],
        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                   "backendRefs": [{"name": SERVICE, "port": HTTP_PORT}]}],
    }


def httproute_manifest(region: str, zone: str, hub: model.Hub) -> dict:
    return {"apiVersion": GW_API, "kind": "HTTPRoute",
            "metadata": _meta(HTTPROUTE, region, zone, annotations=SKIP_AWAIT),
            "spec": httproute_spec(region, zone, hub)}


def certificate_trigger(metadata: dict | None) -> str:
    """`<uid>/<generation>` of the Certificate: a replaced or edited Certificate waits again.
    Numbers cross the Pulumi wire as floats, so the generation is normalised to an int."""
    md = metadata or {}
    gen = md.get("generation")
    return f"{md.get('uid')}/{int(gen) if isinstance(gen, (int, float)) else gen}"


# -- wiring -----------------------------------------------------------------------------------


def _as_list(deps) -> list:
    if deps is None:
        return []
    return list(deps) if isinstance(deps, (list, tuple)) else [deps]


class DownstreamFootprint(pulumi.ComponentResource):
    """Outputs: url, host, addresses (the Gateway's), dnsRecords, installed (true once the
    Certificate is Ready), revision (changes with the server's env, image or identity: pass it as
    RegistryJoin's trigger)."""

    url: pulumi.Output[str]
    installed: pulumi.Output[bool]
    revision: pulumi.Output[str]

    def __init__(self, name: str, *, region: str, zone: model.Zone, hub: model.Hub,
                 zone_provider: k8s.Provider, hub_provider: k8s.Provider, zone_kubeconfig: pulumi.Input[str],
                 identity, depends_on=None, path: str = "zones[]", tsig_keys: dict | None = None,
                 member_addresses: pulumi.Input[list] | None = None, opts: pulumi.ResourceOptions | None = None):
        """identity: a providers.zone_identity.ZoneIdentity (certificatePem, privateKeyPem, thumbprint).
        depends_on: what must be ready on the zone cluster first (cert-manager and Cilium healthy).
        path: the zone's place in the stack config (`zones[0]`), named by failures.
        tsig_keys: kontinuum:dnsTsigKeys parsed (name -> TsigKey), for dns.mode rfc2136.
        member_addresses: the zone's current members' addresses, which a host-network Gateway serves on."""
        super().__init__("kontinuum:index:DownstreamFootprint", name, None, opts)
        z = zone.zone
        secret_data, cm_data = env_config(region, z, hub)  # raises before anything is registered

        def on_zone(*deps) -> pulumi.ResourceOptions:
            return on_zone_cluster(self, zone_provider, zone, [d for d in deps if d])

        def core(cls, suffix: str, manifest: dict, *deps, **extra):
            return cls(f"{name}-{suffix}", metadata=manifest["metadata"], opts=on_zone(*deps), **extra)

        def custom(suffix: str, manifest: dict, *deps):
            return k8s.apiextensions.CustomResource(
                f"{name}-{suffix}", api_version=manifest["apiVersion"], kind=manifest["kind"],
                metadata=manifest["metadata"], spec=manifest["spec"], opts=on_zone(*deps))

        ns = core(k8s.core.v1.Namespace, "namespace", namespace_manifest(region, z), *_as_list(depends_on))

        env_secret = env_secret_manifest(region, z, secret_data)
        env_s = core(k8s.core.v1.Secret, "env-secret", env_secret, ns, type=env_secret["type"],
                     string_data=pulumi.Output.secret(env_secret["stringData"]))
        env_cm = core(k8s.core.v1.ConfigMap, "env-configmap", env_configmap_manifest(region, z, cm_data), ns,
                      data=cm_data)
        ident = identity_secret_manifest(region, z, identity.certificatePem, identity.privateKeyPem)
        ident_s = core(k8s.core.v1.Secret, "identity-secret", ident, ns, type=ident["type"],
                       string_data=pulumi.Output.secret(ident["stringData"]))
        hub_secret = hub_identity_secret_manifest(region, z, identity.certificatePem, identity.thumbprint)
        hub_s = k8s.core.v1.Secret(f"{name}-hub-identity", metadata=hub_secret["metadata"], type=hub_secret["type"],
                                   string_data=hub_secret["stringData"],
                                   opts=pulumi.ResourceOptions(parent=self, provider=hub_provider))

        self.revision = pulumi.Output.from_input(identity.thumbprint).apply(
            lambda tp: config_hash(secret_data, cm_data, zone.server_image, tp))
        dep_m = deployment_manifest(region, z, zone.server_image, self.revision)
        deployment = core(k8s.apps.v1.Deployment, "deployment", dep_m, env_s, env_cm, ident_s, hub_s,
                          spec=dep_m["spec"])
        svc_m = service_manifest(region, z)
        service = core(k8s.core.v1.Service, "service", svc_m, deployment, spec=svc_m["spec"])

        issuer = custom("cluster-issuer", cluster_issuer_manifest(region, z, hub), service, *_as_list(depends_on))
        gateway = custom("gateway", gateway_manifest(region, z, hub, zone.ingress), issuer)
        host = zone_host(region, z, hub)
        exposure = Exposure(name, parent=self, zone=zone, host=host, dns_zone=zone.dns.zone or hub.dns_domain,
                            path=path, labels=labels(region, z), namespace=NAMESPACE, gateway_name=GATEWAY,
                            gateway=gateway, zone_kubeconfig=zone_kubeconfig,
                            tsig_keys=tsig_keys or {}, on_zone=on_zone, depends_on=_as_list(depends_on),
                            member_addresses=member_addresses)
        certificate = custom("certificate", certificate_manifest(region, z, hub), gateway)
        # The route exists before the readiness wait (seeds): the server is reachable over HTTPS
        # as soon as the certificate is issued, and nothing waits on a route created after it.
        route = custom("httproute", httproute_manifest(region, z, hub), gateway)
        ready = CertificateReady(
            f"{name}-certificate-ready", kubeconfig=zone_kubeconfig, namespace=NAMESPACE, name=CERTIFICATE,
            timeout=float(zone.timeouts["certificate"]), gateway=f"{NAMESPACE}/{GATEWAY}",
            trigger=certificate.metadata.apply(certificate_trigger),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[certificate, route, *exposure.waits]))

        self.host = pulumi.Output.from_input(host)
        self.addresses, self.dns_records = exposure.addresses, exposure.records
        self.url = pulumi.Output.from_input(zone_url(region, z, hub))
        self.installed = pulumi.Output.all(ready.ready, route.id).apply(lambda a: bool(a[0]))
        self.namespace, self.deployment, self.service = ns, deployment, service
        self.cluster_issuer, self.gateway, self.certificate = issuer, gateway, certificate
        self.certificate_ready, self.httproute, self.hub_identity_secret = ready, route, hub_s
        self.register_outputs({"url": self.url, "host": self.host, "installed": self.installed,
                               "revision": self.revision, "addresses": self.addresses,
                               "dnsRecords": self.dns_records})
