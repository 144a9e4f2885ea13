"""Kubernetes API clients built from kubeconfig text held in memory (never written to disk)."""

from __future__ import annotations

import yaml
from kubernetes import client, config

from kontinuum.errors import ConfigError


def api_client(kubeconfig: str, *, context: str | None = None) -> client.ApiClient:
    """An ApiClient for the kubeconfig's current (or given) context."""
    try:
        data = yaml.safe_load(kubeconfig)
    except yaml.YAMLError as e:
        raise ConfigError("kubeconfig", f"not valid YAML ({e.__class__.__name__})") from None
    if not isinstance(data, dict) or not data.get("clusters"):
        raise ConfigError("kubeconfig", "no clusters in it; pass the admin kubeconfig of the cluster")
    return config.new_client_from_config_dict(data, context=context)


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
