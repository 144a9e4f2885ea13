"""Kubeconfig: wait (bounded) until Talos hands out the admin kubeconfig and the apiserver in
it answers, then output both.

Two conditions, in order: the Kubeconfig RPC succeeds on the control-plane node (it needs a
bootstrapped cluster), then GET /version with the kubeconfig's own credentials answers (real
hardware starts the apiserver minutes after bootstrap; the lab only after bootstrap). Each
try has a short deadline; past `timeout` the error says which condition never held. The
kubeconfig is fetched once per wait (every fetch mints a new admin certificate) and only
fetched again when the node to ask changes (`pulumi up --replace` forces a new one).

Renewal: when the admin certificate in the held kubeconfig expires within `renewBeforeDays`,
the diff reports a change on its own and the update issues a new one locally from the
cluster CA in the secrets bundle (kontinuum/talos/renewal.py): no node is asked, and the
zone's Kubernetes provider gets the renewed kubeconfig before anything uses it.
"""

from __future__ import annotations

import re

import pulumi
import yaml
from pulumi.dynamic import CreateResult, ReadResult, ResourceProvider, UpdateResult

from kontinuum.errors import KontinuumError
from kontinuum.talos import renewal, secrets
from kontinuum.talos.errors import PermissionDeniedError, TalosError, WrongModeError
from kontinuum.talos.talosconfig import APID_PORT
from kontinuum.talos.waits import WAIT_DEFAULTS, NotYet, WaitTimeout, wait_until
from providers.common import TypedResource, diff_inputs, with_secret_outputs
from providers.talos_common import Inputs, info, known, node_client, warn

FETCH_ON = ("address", "talosPort")  # which node to ask; a re-rendered talosconfig is no reason
UPDATE_ON = (*FETCH_ON, "talosconfig", "timeout", "requestTimeout")
SECRET_OUTPUTS = ("kubeconfig", "talosconfig", "secretsYaml")


class KubeconfigNotReady(KontinuumError):
    pass


def check_kubeconfig(news: dict) -> Inputs:
    inputs = Inputs(news)
    inputs.string("address", "the address of a control-plane node")
    inputs.port()
    inputs.talosconfig()
    inputs.seconds("timeout", WAIT_DEFAULTS.kubeconfig)
    inputs.seconds("requestTimeout", WAIT_DEFAULTS.http_request)
    return inputs


def _api_client(kubeconfig: str):
    """A client for the kubeconfig's current context that makes exactly one try per call.
    (The kubernetes client is imported where used: the program registering this resource
    never needs it, only the provider process does.)"""
    from kubernetes import client as kube, config as kube_config

    from kontinuum.kube import clients

    cfg = kube.Configuration()
    try:
        kube_config.load_kube_config_from_dict(yaml.safe_load(kubeconfig), client_configuration=cfg)
    except (yaml.YAMLError, kube_config.ConfigException, TypeError, AttributeError) as exc:
        raise KontinuumError(
            f"the node handed out a kubeconfig that cannot be used ({exc.__class__.__name__}); "
            "check the cluster's machine config (cluster.controlPlane.endpoint)"
        ) from None
    cfg.retries = False  # urllib3 would otherwise retry 3 times inside one request timeout
    return clients.ApiClient(cfg)


def _reason(exc: Exception) -> str:
    """One line about a failed HTTP try, without urllib3's object reprs."""
    from kubernetes.client import ApiException

    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    text = str(getattr(exc, "reason", None) or exc).strip()
    text = re.sub(r"^<[^>]*>:\s*", "", text.splitlines()[0] if text else "")
    return text or exc.__class__.__name__


def fetch(props: dict) -> dict:
    address = props["address"]
    talos = node_client(props)
    request_timeout = float(props["requestTimeout"])
    got: dict = {}  # kubeconfig, api, endpoint once the RPC has answered

    def attempt(left: float) -> str:
        if "api" not in got:
            try:
                text = talos.kubeconfig(timeout=min(left, talos.deadlines.kubeconfig))
            except (PermissionDeniedError, WrongModeError):
                raise  # the wrong node or talosconfig: waiting will not help
            except TalosError as exc:
                raise NotYet(f"the Kubeconfig RPC on {address} failed: {exc.problem}") from exc
            got["api"] = _api_client(text)
            got["kubeconfig"], got["endpoint"] = text, got["api"].configuration.host
            info(f"{address}: Talos handed out the kubeconfig; waiting for the apiserver at {got['endpoint']}")
        t = min(left, request_timeout)
        try:
            from kubernetes.client import VersionApi

            return VersionApi(got["api"]).get_code(_request_timeout=(t, t)).git_version
        except Exception as exc:  # any failure of one try is an observation, not the verdict
            raise NotYet(f"the apiserver at {got['endpoint']} did not answer GET /version: {_reason(exc)}") from exc

    try:
        version = wait_until(
            f"Kubeconfig {address}: the Kubeconfig RPC to succeed and its apiserver to answer",
            attempt,
            timeout=float(props["timeout"]),
            remedy="",
        )
    except WaitTimeout as exc:
        if "api" in got:
            failed = f"the Kubeconfig RPC succeeded, but the apiserver at {got['endpoint']} never answered"
            remedy = (
                "The control plane may still be starting (raise timeout), or the endpoint is not reachable from "
                f"here: check `talosctl -n {address} service kubelet` and `talosctl -n {address} containers -k`, "
                "and that the cluster endpoint routes to a control plane"
            )
        else:
            failed = f"the Kubeconfig RPC on {address} never succeeded"
            remedy = (
                "Kubeconfig needs a bootstrapped cluster and a control-plane node that answers with this "
                f"cluster's talosconfig: check the Bootstrap step and `talosctl -n {address} service etcd`"
            )
        raise KubeconfigNotReady(
            f"Kubeconfig {address}: not ready within {exc.bound:g} s: {failed}; last observation: {exc.last}. "
            f"{remedy}, then run `pulumi up` again."
        ) from None
    finally:
        if "api" in got:
            got["api"].close()
    info(f"{address}: apiserver {got['endpoint']} answers (Kubernetes {version})")
    return {"kubeconfig": got["kubeconfig"], "endpoint": got["endpoint"], "kubernetesVersion": version}


class KubeconfigProvider(ResourceProvider):
    def check(self, _olds, news):
        return check_kubeconfig(news).result()

    def diff(self, _id, olds, news):
        d = diff_inputs(olds, news, update_on=UPDATE_ON)
        # Due for renewal now, a refresh found it due (valid: false), or the bundle's cluster CA is
        # not the one the held kubeconfig trusts (a Kubernetes CA rotation switched it): the update
        # renews it. The held kubeconfig is compared, not the bundle text, so a state from before
        # the bundle was an input stays unchanged (and the zone's provider keeps a known kubeconfig).
        renews = _renewal_due(olds, news) or olds.get("valid") is False or _ca_rotated(olds, news)
        if not d.changes and renews:
            d.changes = True
        if d.changes and all(known(news.get(k)) and olds.get(k) == news.get(k) for k in FETCH_ON):
            # The same node: the update keeps what it holds (a new talosconfig alone is no reason to
            # fetch), so a preview keeps it known; the kubeconfig changes only when renewed.
            d.stables = ["endpoint", "kubernetesVersion", *(() if renews else ("kubeconfig", "kubeconfigExpires"))]
        return d

    def create(self, props):
        outs = {k: props.get(k) for k in SETTINGS}
        return CreateResult(id_=props["address"], outs=_with_expiry({**outs, **fetch(props)}))

    def update(self, _id, olds, news):
        outs = {k: news.get(k) for k in SETTINGS}
        if all(olds.get(k) == news.get(k) for k in FETCH_ON):  # same node: keep what we have
            kept = {k: olds.get(k) for k in ("kubeconfig", "endpoint", "kubernetesVersion")}
            k8s_ca = secrets.load(news["secretsYaml"], check_rsa=False).k8s if news.get("secretsYaml") else None
            if k8s_ca and _ca_switched(kept["kubeconfig"], k8s_ca.crt):
                kept["kubeconfig"] = renewal.renew_kubeconfig(kept["kubeconfig"], k8s_ca)
                info(f"{news['address']}: the cluster CA was rotated; the admin kubeconfig now trusts the new CA "
                     "and holds a client certificate of it")
            elif k8s_ca and _renewal_due(olds, news):
                kept["kubeconfig"] = renewal.renew_kubeconfig(kept["kubeconfig"], k8s_ca)
                info(f"{news['address']}: renewed the admin kubeconfig's client certificate locally")
            return UpdateResult(outs=_with_expiry({**outs, **kept}))
        return UpdateResult(outs=_with_expiry({**outs, **fetch(news)}))

    def read(self, id_, props):
        """Refresh: a held admin certificate due for renewal is drift (valid: false), which the
        next up repairs by renewing it locally. Offline: nothing is contacted."""
        if not _renewal_due(props, props):
            return ReadResult(id_=id_, outs=props)
        warn(f"Kubeconfig {props.get('address')}: drift: the admin client certificate is due for renewal; "
             "the next up renews it")
        return ReadResult(id_=id_, outs={**props, "valid": False})


SETTINGS = (*UPDATE_ON, "secretsYaml", "renewBeforeDays", "kubernetesCa")


def _ca_rotated(olds: dict, news: dict) -> bool:
    """The bundle's cluster CA differs from the one the held kubeconfig trusts. Its certificate
    (`kubernetesCa`, public) is known at preview unless a Kubernetes CA rotation starts; without it
    (a state recorded before it) the bundle is read, and an unknown bundle (a preview while
    TalosSecrets changes) may carry a new CA: a change."""
    ca, held = news.get("kubernetesCa"), olds.get("kubeconfig")
    if isinstance(ca, str) and ca and isinstance(held, str):
        return _ca_switched(held, ca.encode())
    bundle = news.get("secretsYaml")
    if not known(bundle):
        return True
    if not bundle or not isinstance(held, str):
        return False
    try:
        k8s_ca = secrets.load(bundle, check_rsa=False).k8s
    except (ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return False  # check reports an unreadable bundle; nothing to compare here
    return _ca_switched(held, k8s_ca.crt)


def _ca_switched(kubeconfig: str, k8s_ca_crt: bytes) -> bool:
    """The held kubeconfig trusts another CA than the bundle's (a Kubernetes CA rotation ended)."""
    from cryptography import x509

    try:
        held = x509.load_pem_x509_certificates(renewal.kubeconfig_ca(kubeconfig))
        return x509.load_pem_x509_certificate(k8s_ca_crt) not in held
    except (ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return False


def _renewal_due(olds: dict, news: dict) -> bool:
    """The held admin certificate expires within renewBeforeDays (reads the clock, nothing else)."""
    held = olds.get("kubeconfig")
    if not isinstance(held, str) or not known(news.get("renewBeforeDays")):
        return False
    days = news.get("renewBeforeDays")
    try:
        return renewal.due(renewal.kubeconfig_cert(held),
                           float(days) if isinstance(days, (int, float)) else renewal.RENEW_BEFORE_DAYS)
    except (ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return False  # no client certificate to renew (e.g. token auth)


def _with_expiry(outs: dict) -> dict:
    try:
        expires = renewal.rfc3339(renewal.expiry(renewal.kubeconfig_cert(outs["kubeconfig"])))
    except (ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        expires = None  # a kubeconfig without a client certificate (token auth): nothing to renew
    return {**outs, "kubeconfigExpires": expires}


class Kubeconfig(TypedResource, module="talos", name="Kubeconfig"):
    """Outputs: kubeconfig (secret, admin), endpoint (the apiserver URL in it, not secret),
    kubernetesVersion (what GET /version answered), kubeconfigExpires (RFC 3339 UTC)."""

    kubeconfig: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    kubernetesVersion: pulumi.Output[str]
    kubeconfigExpires: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        address: pulumi.Input[str],
        talosconfig: pulumi.Input[str],
        talos_port: pulumi.Input[int] = APID_PORT,
        timeout: pulumi.Input[float] = WAIT_DEFAULTS.kubeconfig,
        request_timeout: pulumi.Input[float] = WAIT_DEFAULTS.http_request,
        secrets_yaml: pulumi.Input[str] | None = None,
        kubernetes_ca: pulumi.Input[str] | None = None,
        renew_before_days: pulumi.Input[float] = renewal.RENEW_BEFORE_DAYS,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "secretsYaml": pulumi.Output.secret(secrets_yaml) if secrets_yaml is not None else None,
            "renewBeforeDays": renew_before_days,
            "kubernetesCa": kubernetes_ca,
            "kubeconfigExpires": None,
            "address": address,
            "talosPort": talos_port,
            "talosconfig": pulumi.Output.secret(talosconfig),
            "timeout": timeout,
            "requestTimeout": request_timeout,
            "kubeconfig": None,
            "endpoint": None,
            "kubernetesVersion": None,
        }
        super().__init__(KubeconfigProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_OUTPUTS))
