"""Kubeconfig: wait (bounded) until Talos hands out the admin kubeconfig and the apiserver in
it answers, then output both.

Two conditions, in order: the Kubeconfig RPC succeeds on the control-plane node (it needs a
bootstrapped cluster), then GET /version with the kubeconfig's own credentials answers (real
hardware starts the apiserver minutes after bootstrap; the lab only after bootstrap). Each
try has a short deadline; past `timeout` the error says which condition never held. The
kubeconfig is fetched once per wait (every fetch mints a new admin certificate) and only
fetched again when the node to ask changes (`pulumi up --replace` forces a new one).
"""

from __future__ import annotations

import re

import pulumi
import yaml
from pulumi.dynamic import CreateResult, ReadResult, ResourceProvider, UpdateResult

from kontinuum.errors import KontinuumError
from kontinuum.talos.errors import PermissionDeniedError, TalosError, WrongModeError
from kontinuum.talos.transport import APID_PORT
from kontinuum.talos.waits import WAIT_DEFAULTS, NotYet, WaitTimeout, wait_until
from providers.common import TypedResource, diff_inputs, with_secret_outputs
from providers.talos_common import Inputs, info, node_client, warn

FETCH_ON = ("address", "talosPort")  # which node to ask; a re-rendered talosconfig is no reason
UPDATE_ON = (*FETCH_ON, "talosconfig", "timeout", "requestTimeout")
SECRET_OUTPUTS = ("kubeconfig", "talosconfig")


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

    cfg = kube.Configuration()
    try:
        kube_config.load_kube_config_from_dict(yaml.safe_load(kubeconfig), client_configuration=cfg)
    except (yaml.YAMLError, kube_config.ConfigException, TypeError, AttributeError) as exc:
        raise KontinuumError(
            f"the node handed out a kubeconfig that cannot be used ({exc.__class__.__name__}); "
            "check the cluster's machine config (cluster.controlPlane.endpoint)"
        ) from None
    cfg.retries = False  # urllib3 would otherwise retry 3 times inside one request timeout
    return kube.ApiClient(cfg)


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


RENEW_BEFORE = 30 * 86400.0  # seconds: a client certificate closer to its end than this is renewed


def client_cert_left(kubeconfig: str, now=None) -> float | None:
    """Seconds the kubeconfig's client certificate is still valid (negative: expired), or None
    when it holds none that can be read. Offline: nothing is contacted."""
    import base64
    import datetime as dt

    from cryptography import x509

    try:
        doc = yaml.safe_load(kubeconfig)
        current = doc.get("current-context")
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == current) if current else doc["contexts"][0]["context"]
        user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
        cert = x509.load_pem_x509_certificate(base64.b64decode(user["client-certificate-data"]))
    except Exception:  # noqa: BLE001 - not a kubeconfig with an inline client certificate
        return None
    return (cert.not_valid_after_utc - (now or dt.datetime.now(dt.timezone.utc))).total_seconds()


class KubeconfigProvider(ResourceProvider):
    def check(self, _olds, news):
        return check_kubeconfig(news).result()

    def diff(self, _id, olds, news):
        result = diff_inputs(olds, news, update_on=UPDATE_ON)
        if olds.get("valid") is False:
            result.changes = True  # a refresh found the client certificate (nearly) expired: renew
        return result

    def create(self, props):
        outs = {k: props.get(k) for k in UPDATE_ON}
        return CreateResult(id_=props["address"], outs={**outs, **fetch(props)})

    def update(self, _id, olds, news):
        outs = {k: news.get(k) for k in UPDATE_ON}
        if olds.get("valid") is not False and all(olds.get(k) == news.get(k) for k in FETCH_ON):  # keep it
            kept = {k: olds.get(k) for k in ("kubeconfig", "endpoint", "kubernetesVersion")}
            return UpdateResult(outs={**outs, **kept})
        return UpdateResult(outs={**outs, **fetch(news)})

    def read(self, id_, props):
        """Refresh: is the admin kubeconfig's client certificate still valid for RENEW_BEFORE?
        If not, that is drift (valid: false) and the next up fetches a new one."""
        left = client_cert_left(props.get("kubeconfig") or "")
        if left is None:
            return ReadResult(id_=id_, outs=props)
        if left > RENEW_BEFORE:
            return ReadResult(id_=id_, outs=props)
        state = "expired" if left <= 0 else f"expires in {left / 86400:.1f} days"
        warn(f"Kubeconfig {props.get('address')}: drift: the admin client certificate {state}; the next up renews it")
        return ReadResult(id_=id_, outs={**props, "valid": False})


class Kubeconfig(TypedResource, module="talos", name="Kubeconfig"):
    """Outputs: kubeconfig (secret, admin), endpoint (the apiserver URL in it, not secret),
    kubernetesVersion (what GET /version answered)."""

    kubeconfig: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    kubernetesVersion: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        address: pulumi.Input[str],
        talosconfig: pulumi.Input[str],
        talos_port: pulumi.Input[int] = APID_PORT,
        timeout: pulumi.Input[float] = WAIT_DEFAULTS.kubeconfig,
        request_timeout: pulumi.Input[float] = WAIT_DEFAULTS.http_request,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
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
