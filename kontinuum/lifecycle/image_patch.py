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

from kontinuum.errors import KontinuumError
from kontinuum.talos.errors import TalosError

IMAGE_PATHS: dict[str, tuple[str, ...]] = {
    "kube-apiserver": ("cluster", "apiServer", "image"),
    "kube-controller-manager": ("cluster", "controllerManager", "image"),
    "kube-scheduler": ("cluster", "scheduler", "image"),
    "kube-proxy": ("cluster", "proxy", "image"),
    "kubelet": ("machine", "kubelet", "image"),
}


class NoV1Alpha1(ValueError):
    """The config has no v1alpha1 document to patch."""


class ImagePatchError(KontinuumError):
    """A node's live config could not be read, patched or applied; nothing after it was touched."""


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


def apply(talos, who: str, component: str, image: str) -> bool:
    """Read the node's live config (`talos`: its TalosClient), set only the component's image and
    apply it NO_REBOOT. False, with no apply, when the live config names that image already.
    `who` names the node in errors."""
    try:
        live = talos.machine_config()
    except TalosError as e:
        raise ImagePatchError(f"could not read the live machine config of {who} ({e}). Nothing after this node was "
                              "touched; bring it back, then run `pulumi up` again.") from e
    try:
        if image_in(live, component) == image:
            return False
        patched = with_image(live, component, image)
    except (ValueError, yaml.YAMLError) as e:
        raise ImagePatchError(f"the live machine config of {who} cannot take an image patch ({e}); nothing after "
                              "this node was touched.") from e
    try:
        talos.apply_config(patched, mode="no-reboot")
    except TalosError as e:
        # Talos: "this config change can't be applied in immediate mode" (a reboot would be needed)
        why = (" Talos says the change needs a reboot, which an image change never should: compare the node's live "
               "config with what it runs (`talosctl get machineconfig`)." if "immediate mode" in str(e) else "")
        raise ImagePatchError(f"{who} refused its live config with only {component} set to {image} in no-reboot "
                              f"mode ({e}).{why} Nothing after this node was touched; fix the cause, then run "
                              "`pulumi up` again.") from e
    return True
