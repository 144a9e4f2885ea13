"""One component's image set in a node's live machine config, nothing else (talosctl
upgrade-k8s's patch: reference/failure-facts.md §4).

The Kubernetes upgrade reads the node's live config (COSI MachineConfig v1alpha1), changes only
cluster.{apiServer|controllerManager|scheduler|proxy}.image or machine.kubelet.image and sends it
back with NO_REBOOT, so no other pending change rides along (those are ConfigApply's, after the
rollout). The image is replaced in the text where the current value occurs exactly once, so every
other byte stays as the node has it (a YAML round trip through PyYAML could change values such
as `0o644`); otherwise (no image named yet, or the value repeated) the document is re-encoded.
"""

from __future__ import annotations

import re

import yaml

IMAGE_PATHS: dict[str, tuple[str, ...]] = {
    "kube-apiserver": ("cluster", "apiServer", "image"),
    "kube-controller-manager": ("cluster", "controllerManager", "image"),
    "kube-scheduler": ("cluster", "scheduler", "image"),
    "kube-proxy": ("cluster", "proxy", "image"),
    "kubelet": ("machine", "kubelet", "image"),
}


class NoV1Alpha1(ValueError):
    """The config has no v1alpha1 document to patch."""


def _v1alpha1(docs: list) -> dict:
    for doc in docs:
        if isinstance(doc, dict) and doc.get("version") == "v1alpha1" and "kind" not in doc:
            return doc
    raise NoV1Alpha1("the machine config has no v1alpha1 document")


def image_in(config: str, component: str) -> str | None:
    """The component's image the config names (None when it names none: Talos's default)."""
    value: object = _v1alpha1(list(yaml.safe_load_all(config)))
    for key in IMAGE_PATHS[component]:
        value = value.get(key) if isinstance(value, dict) else None
    return str(value) if value else None


def _token(value: str) -> re.Pattern:
    """`value` as a whole YAML scalar (optionally quoted), not as part of a longer one."""
    return re.compile(r"(?<![\w./:@-])" + re.escape(value) + r"(?![\w./:@-])")


def with_image(config: str, component: str, image: str) -> str:
    """The config with only the component's image set to `image`."""
    current = image_in(config, component)
    if current == image:
        return config
    if current and len(_token(current).findall(config)) == 1:
        return _token(current).sub(lambda _m: image, config)
    docs = list(yaml.safe_load_all(config))
    parent = _v1alpha1(docs)
    *parents, leaf = IMAGE_PATHS[component]
    for key in parents:
        if not isinstance(parent.get(key), dict):
            parent[key] = {}
        parent = parent[key]
    parent[leaf] = image
    return yaml.safe_dump_all(docs, sort_keys=False)
