"""The hub's CustomResourceDefinitions (group kontinuum.sh) and the names of the hub contract.

The YAML files next to this module are the single source: the lab hub installs them, a real
hub operator applies them, and the inventory/registry code addresses objects through the
constants below so a renamed plural or label cannot drift between writer and reader.
"""

from __future__ import annotations

from pathlib import Path

import yaml

GROUP = "kontinuum.sh"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

INSTANCE_KIND = "Instance"
INSTANCE_PLURAL = "instances"
KONTINUUM_KIND = "Kontinuum"
KONTINUUM_PLURAL = "kontinuums"

LABEL_REGION = "kontinuum.sh/region"
LABEL_ZONE = "kontinuum.sh/zone"
LABEL_CLAIMED_BY = "kontinuum.sh/claimed-by"
LABEL_LOST = "kontinuum.sh/lost"  # "true": the machine is declared lost (README: Lost machines)

# Hub-side Secrets (the public half of each zone identity) live in this namespace.
HUB_NAMESPACE = "kontinuum-system"
# Key of the self-signed identity certificate in the hub Secret. The hub holds no private
# key, so that Secret is Opaque, not kubernetes.io/tls (which would demand tls.key).
HUB_IDENTITY_CERT_KEY = "tls.crt"

# Registry join: what the zone's kontinuum-server finds on its own cluster. The downstream
# footprint writes these and the server (or the lab stand-in) reads them, so both import them.
ZONE_NAMESPACE = "kontinuum-system"
ZONE_DEPLOYMENT = "kontinuum"
ZONE_IDENTITY_SECRET = "kontinuum-identity"  # kubernetes.io/tls: the identity's private half
ZONE_ENV = "kontinuum-env"  # name of both the env Secret and the env ConfigMap
ENV_REGION = "KONTINUUM_SERVER_REGION"  # kontinuum-env ConfigMap keys the server registers with
ENV_ZONE = "KONTINUUM_SERVER_ZONE"
ENV_ENDPOINT = "KONTINUUM_SERVER_ENDPOINT"

_FILES = ("instances.yaml", "kontinuums.yaml")


def zone_object_name(region: str, zone: str) -> str:
    """Name of every per-zone object, the Kontinuum included (DESIGN §4)."""
    return f"{region}-{zone}"


def hub_identity_secret_name(region: str, zone: str) -> str:
    """The hub Secret holding the zone identity's self-signed public certificate."""
    return f"{zone_object_name(region, zone)}-identity"


def manifests() -> list[dict]:
    """The CRD objects, freshly parsed so callers may mutate them."""
    here = Path(__file__).parent
    return [yaml.safe_load((here / name).read_text()) for name in _FILES]
