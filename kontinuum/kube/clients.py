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
