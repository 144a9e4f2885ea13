"""Kubernetes API clients built from kubeconfig text held in memory: we write no kubeconfig file.
The client library keeps the certificate and key data it needs for TLS in private temporary files
(mode 0600, reused per content, removed when the process exits)."""

from __future__ import annotations

import threading

import yaml
from kubernetes import client, config

from kontinuum.errors import ConfigError


# kubernetes' loader (config/kube_config.py _create_temp_file_with_content) names a temporary file
# for a certificate before it writes it, and another thread loading the same certificate gets that
# name at once: an empty CA file ("no certificate or crl found"). Seen when a provider updated
# several hub records in parallel. One load at a time in this process.
_LOADING = threading.Lock()


class ApiClient(client.ApiClient):
    """kubernetes' ApiClient, with models built against one shared Configuration.

    The generated models make a fresh `Configuration()` for every object they build when none is
    passed, and the client's deserializer passes none: each one creates loggers, resets their
    levels under logging's global lock and counts CPUs, so reading a list of pods cost more CPU
    than the request, and threads polling several clusters queued on that lock. The shared one
    is read only (the models look at `client_side_validation`), so the objects are the same."""

    _models_configuration = type.__call__(client.Configuration)

    def _ApiClient__deserialize_model(self, data, klass):  # the private hook the deserializer calls
        types = klass.openapi_types
        if not types and not hasattr(klass, "get_real_child_model"):
            return data
        kwargs = {}
        if isinstance(data, dict) and types:
            for attr, attr_type in types.items():
                key = klass.attribute_map[attr]
                if key in data:
                    kwargs[attr] = self._ApiClient__deserialize(data[key], attr_type)
        instance = klass(local_vars_configuration=self._models_configuration, **kwargs)
        if hasattr(instance, "get_real_child_model"):
            real = instance.get_real_child_model(data)
            if real:
                return self._ApiClient__deserialize(data, real)
        return instance


def api_client(kubeconfig: str, *, context: str | None = None, retries: int | None = None) -> client.ApiClient:
    """An ApiClient for the kubeconfig's current (or given) context; `retries` (e.g. 0 for a
    one-look read) overrides urllib3's default of retrying a failed connection three times."""
    try:
        data = yaml.safe_load(kubeconfig)
    except yaml.YAMLError as e:
        raise ConfigError("kubeconfig", f"not valid YAML ({e.__class__.__name__})") from None
    if not isinstance(data, dict) or not data.get("clusters"):
        raise ConfigError("kubeconfig", "no clusters in it; pass the admin kubeconfig of the cluster")
    configuration = type.__call__(client.Configuration)
    with _LOADING:
        config.load_kube_config_from_dict(data, context=context, client_configuration=configuration)
    if retries is not None:
        configuration.retries = retries
    _skip_trust_store(configuration)
    return ApiClient(configuration=configuration)


def _skip_trust_store(configuration: client.Configuration) -> None:
    """A client that verifies no server certificate (insecure-skip-tls-verify) gets no trust
    store to load. kubernetes' REST client gives such a client certifi's whole bundle as its CA
    file (kubernetes 34.1 client/rest.py), and urllib3 loads that file into a fresh SSL context on
    every new connection: about 16 ms of CPU each under OpenSSL 3, which a watch re-opened every
    second turns into a core's worth. With verification off the file is never used to decide
    anything, so any one certificate will do: the client's own."""
    if not configuration.verify_ssl and not configuration.ssl_ca_cert and configuration.cert_file:
        configuration.ssl_ca_cert = configuration.cert_file


def server_of(kubeconfig: str) -> str:
    """The API server URL of the kubeconfig's current context, for messages ('?' when unknown)."""
    try:
        data = yaml.safe_load(kubeconfig) or {}
        ctx_name = data.get("current-context")
        ctx = next((c["context"] for c in data.get("contexts") or [] if c.get("name") == ctx_name), {})
        cluster = next((c["cluster"] for c in data.get("clusters") or [] if c.get("name") == ctx.get("cluster")),
                       (data.get("clusters") or [{}])[0].get("cluster", {}))
        return cluster.get("server") or "?"
    except (yaml.YAMLError, AttributeError, KeyError, TypeError, IndexError):
        return "?"


def probe_api_server(kubeconfig: str, timeout: float) -> str | None:
    """None when the API server answers at all (any HTTP status), else why it did not."""
    api = api_client(kubeconfig)
    try:
        client.VersionApi(api).get_code(_request_timeout=timeout)
        return None
    except client.ApiException:
        return None  # it answered: reachable, whatever it thinks of us
    except Exception as e:  # noqa: BLE001 - every transport failure is the answer
        return describe_error(e)
    finally:
        api.close()


def describe_error(e: BaseException) -> str:
    """One short line: an ApiException's status, or a connection error's innermost reason."""
    if isinstance(e, client.ApiException):
        return f"HTTP {e.status} {e.reason}"
    reason = getattr(e, "reason", None)  # urllib3 MaxRetryError wraps the real cause
    if isinstance(reason, BaseException):
        return describe_error(reason)
    text = str(e)
    if text.startswith("<") and ": " in text:  # NewConnectionError: '<connection object at 0x…>: Failed to …'
        text = text[text.index(": ") + 2:]
    return f"{type(e).__name__}: {text}"
