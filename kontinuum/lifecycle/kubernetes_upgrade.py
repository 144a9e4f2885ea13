"""A zone's Kubernetes upgrade, talosctl upgrade-k8s's flow done by us (reference/day2-facts.md
§2, DESIGN §10). No Pulumi: providers/kubernetes_version.py calls it.

Order (rollout()):
1. pre-pull: the target images on the nodes that will change, before any node is touched, as
   talosctl does (MachineService.ImagePull): kube-apiserver, kube-controller-manager and
   kube-scheduler on every control plane into the CRI namespace, then the kubelet on every node
   into the system namespace; a node that does not implement it is skipped, any other failure
   stops the rollout there, naming node and image, with nothing changed. We pull exactly the
   images the target config names (talosctl builds the kubelet's from --kubelet-image and keeps
   the node's -fat/-slim suffix; the zone's config already says which one it runs);
2. each control plane one at a time, and on it kube-apiserver → kube-controller-manager →
   kube-scheduler, each through its machine config (ApplyConfiguration NO_REBOOT of the whole
   config, as talosctl's patch does), waiting until that node's static pod runs the target image
   and is Ready;
3. every kubelet node by node, control planes first (machine.kubelet.image), waiting until the
   Node reports the target kubelet version and is Ready;
4. the bootstrap manifests (bootstrap_manifests.py): read from the first control plane, whose
   config (cluster.proxy.image included) is the target by then, server-side applied, and their
   workloads waited for. talosctl's phase 3 (cluster.proxy.image on the control planes) needs no
   step of its own: every config a step sends carries the target proxy image.
The zone's ConfigApply resources depend on this rollout and apply the full configs after it.

Each step sends the node the zone's TARGET config with the images of the steps still ahead held
at what the node runs now, so one component moves at a time. Resumable by reading the truth
first: a component whose pod already runs the target image and is Ready, or a kubelet whose
Node already reports the target version and is Ready, is skipped without a call to its node, so
a re-run after a kill never redoes a finished node (the pre-pull and the manifest sync, which
change nothing a node runs, are simply done again). Every wait is bounded and names the node
and the component.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable

import yaml
from kubernetes import client

from kontinuum.errors import KontinuumError
from kontinuum.kube.clients import describe_error
from kontinuum.lifecycle import bootstrap_manifests
from kontinuum.talos import lifecycle
from kontinuum.talos.client import TalosClient
from kontinuum.talos.errors import TalosError
from kontinuum.talos.waits import WAIT_DEFAULTS, NotYet, wait_until

# Static pods in upgrade order, with where the machine config holds each one's image.
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kube-apiserver", ("cluster", "apiServer", "image")),
    ("kube-controller-manager", ("cluster", "controllerManager", "image")),
    ("kube-scheduler", ("cluster", "scheduler", "image")),
)
KUBELET = "kubelet"
KUBELET_PATH = ("machine", "kubelet", "image")
STATIC_PODS, KUBELETS = "static-pods", "kubelet"
NAMESPACE = "kube-system"
REQUEST_TIMEOUT = 10.0  # seconds per Kubernetes API call
# Pods and Nodes change within seconds of a config: short, even pauses keep the rollout close
# to what the nodes take (bench/upgrade.py measures the overhead).
_POLL = dataclasses.replace(WAIT_DEFAULTS, first_pause=0.2, max_pause=0.5)


class KubernetesUpgradeError(KontinuumError):
    """A step could not run (the API does not answer, a node refused its config)."""


@dataclass(frozen=True)
class Node:
    name: str  # how messages name the node (its Instance)
    address: str
    control_plane: bool
    config: str  # the zone's target machine config for this node's pool (secret)


@dataclass(frozen=True)
class Step:
    node: Node
    phase: str  # STATIC_PODS or KUBELETS

    @property
    def components(self) -> tuple[str, ...]:
        return tuple(c for c, _ in COMPONENTS) if self.phase == STATIC_PODS else (KUBELET,)


def plan(nodes: Iterable[Node]) -> list[Step]:
    """The documented order: control planes' static pods one node at a time, then kubelets
    node by node, control planes first; the given order is kept within each group."""
    nodes = list(nodes)
    cps = [n for n in nodes if n.control_plane]
    workers = [n for n in nodes if not n.control_plane]
    return [Step(n, STATIC_PODS) for n in cps] + [Step(n, KUBELETS) for n in cps + workers]


def plan_lines(steps: list[Step], current: str, target: str) -> list[str]:
    return [f"Kubernetes upgrade, step {i}/{len(steps)}: {s.node.name} ({s.node.address}) "
            f"{', '.join(s.components)} {current} → {target}" for i, s in enumerate(steps, 1)]


# --- machine config (pure) ----------------------------------------------------------------------


def with_tag(image: str, version: str) -> str:
    """`image` with its tag set to `version` (v-prefixed, as Kubernetes images are tagged)."""
    name = image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    return f"{name}:v{version.removeprefix('v')}"


def tag_of(image: str) -> str:
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else ""


def _v1alpha1(docs: list) -> dict:
    for doc in docs:
        if isinstance(doc, dict) and doc.get("version") == "v1alpha1" and "kind" not in doc:
            return doc
    raise KubernetesUpgradeError("the zone's machine config has no v1alpha1 document")


def _dig(doc: dict, path: tuple[str, ...]) -> object:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def proxy_image(config: str) -> str | None:
    """cluster.proxy.image of the config, None when kube-proxy is disabled or no image is named."""
    proxy = _dig(_v1alpha1(list(yaml.safe_load_all(config))), ("cluster", "proxy"))
    if not isinstance(proxy, dict) or proxy.get("disabled") or not proxy.get("image"):
        return None
    return str(proxy["image"])


def target_images(config: str) -> dict[str, str]:
    """component → image in the config (the kubelet included; static pods on control planes)."""
    doc = _v1alpha1(list(yaml.safe_load_all(config)))
    found = {c: _dig(doc, path) for c, path in (*COMPONENTS, (KUBELET, KUBELET_PATH))}
    return {c: str(image) for c, image in found.items() if image}


def held_back(config: str, keep: dict[str, str]) -> str:
    """The target config with the images of `keep` (component → image) put back. Each image is
    replaced in the text where it occurs exactly once, so every other byte stays as rendered;
    otherwise the document is re-written."""
    images = target_images(config)
    text = config
    for component, image in keep.items():
        current = images.get(component)
        if current and text.count(current) == 1:
            text = text.replace(current, image)
        else:
            return _rewritten(config, keep)
    return text


def _rewritten(config: str, keep: dict[str, str]) -> str:
    docs = list(yaml.safe_load_all(config))
    doc = _v1alpha1(docs)
    paths = dict((*COMPONENTS, (KUBELET, KUBELET_PATH)))
    for component, image in keep.items():
        *parents, leaf = paths[component]
        parent = doc
        for key in parents:
            parent = parent.setdefault(key, {})
        parent[leaf] = image
    return yaml.safe_dump_all(docs, sort_keys=False)


# --- what the cluster says (the truth each step reads first) ------------------------------------


@dataclass(frozen=True)
class Seen:
    version: str  # the running image's tag, or the Node's kubelet version ("" when none)
    image: str
    ready: bool
    detail: str  # for messages: what was seen


def _ready(obj) -> tuple[bool, str]:
    cond = next((c for c in ((obj.status.conditions if obj.status else None) or []) if c.type == "Ready"), None)
    if cond is None:
        return False, "no Ready condition"
    return cond.status == "True", f"Ready={cond.status}" + (f" ({cond.reason})" if cond.reason else "")


def static_pod(core: client.CoreV1Api, component: str, address: str) -> Seen | None:
    """The component's static (mirror) pod on the node at `address` (status.hostIP, as talosctl
    matches it); None when there is none."""
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"k8s-app={component}",
                                    _request_timeout=REQUEST_TIMEOUT).items
    mine = [p for p in pods if p.status and p.status.host_ip == address and not p.metadata.deletion_timestamp]
    if not mine:
        return None
    pod = mine[0]
    container = next((c for c in pod.spec.containers if c.name == component), pod.spec.containers[0])
    ready, why = _ready(pod)
    return Seen(tag_of(container.image), container.image, ready, f"pod {pod.metadata.name} runs {container.image}, {why}")


def node_kubelet(core: client.CoreV1Api, address: str) -> Seen | None:
    """The kubelet of the Node whose addresses include `address`; None when there is none."""
    for node in core.list_node(_request_timeout=REQUEST_TIMEOUT).items:
        if any(a.address == address for a in (node.status.addresses or [])):
            version = node.status.node_info.kubelet_version if node.status.node_info else ""
            ready, why = _ready(node)
            return Seen(version, "", ready, f"Node {node.metadata.name} reports kubelet {version}, {why}")
    return None


# --- the rollout ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    client_for: Callable[[str], TalosClient]
    core: client.CoreV1Api  # the cluster's API
    log: Callable[[str], None]
    timeout: float  # each component of each node
    # A component already on the target but not Ready: during an upgrade it may be the one a
    # killed run just changed, so the rollout waits for it before going on. When the record is
    # new (a zone this stack made before it kept one) nothing was changed: no wait, no apply.
    settle_unready: bool = True
    # The bootstrap-manifest sync after the kubelets (off when nothing was upgraded: an adopted zone).
    sync_manifests: bool = True


def _read(ctx: Context, what: str, read: Callable[[], Seen | None]) -> Seen | None:
    try:
        return read()
    except Exception as e:  # noqa: BLE001 - the API's failure, named
        raise KubernetesUpgradeError(f"could not read {what} from the cluster API ({describe_error(e)}). Bring the "
                                     "API back, then run `pulumi up` again: finished nodes are not touched again.")


def _on_target(seen: Seen | None, target: str) -> bool:
    return seen is not None and seen.version.removeprefix("v") == target.removeprefix("v")


def _done(seen: Seen | None, target: str) -> bool:
    return _on_target(seen, target) and seen.ready


def _apply(ctx: Context, node: Node, config: str, what: str) -> None:
    try:
        ctx.client_for(node.address).apply_config(config, mode="no-reboot")
    except TalosError as e:
        raise KubernetesUpgradeError(
            f"{node.name} ({node.address}) refused the machine config with {what} ({e}). Nothing after this node "
            "was touched; fix the cause, then run `pulumi up` again.") from e


def _wait(ctx: Context, node: Node, component: str, target: str, read: Callable[[], Seen | None]) -> Seen:
    def probe(_left: float) -> Seen:
        try:
            seen = read()
        except Exception as e:  # noqa: BLE001 - an API hiccup under load: try again within the bound
            raise NotYet(f"the cluster API did not answer ({describe_error(e)})") from e
        if seen is None:
            raise NotYet(f"no {component} reported on {node.address} yet")
        if not _done(seen, target):
            raise NotYet(seen.detail)
        return seen

    what = "Node" if component == KUBELET else "static pod"
    return wait_until(f"{component} on {node.name} ({node.address}) to run {target} and be Ready", probe,
                      timeout=ctx.timeout, bounds=_POLL,
                      remedy=f"Check that node's {component} ({what} status, its logs); raise timeouts.kubernetesUpgrade "
                             "if it is only slow, then run `pulumi up` again: finished nodes are not touched again.")


def run_step(ctx: Context, step: Step, target: str) -> dict[str, str]:
    """Bring one node's components of this step to `target`; returns component → version."""
    node = step.node
    images = target_images(node.config)
    reads = _reads(ctx, node)
    result: dict[str, str] = {}
    order = [c for c, _ in COMPONENTS] if node.control_plane else []
    for component in step.components:
        seen = _read(ctx, f"{component} of {node.name} ({node.address})", reads[component])
        if _done(seen, target) or (_on_target(seen, target) and not ctx.settle_unready):
            ctx.log(f"{node.address}: {component} already runs {seen.version}")
            result[component] = seen.version
            continue
        if _on_target(seen, target):  # changed by a killed run: settle it, never apply it again
            result[component] = _wait(ctx, node, component, target, reads[component]).version
            ctx.log(f"{node.address}: {component} runs {result[component]} and is Ready")
            continue
        if component not in images:
            raise KubernetesUpgradeError(f"the zone's machine config for {node.name} names no {component} image")
        # Everything after this component keeps what the node runs now: one component moves at a time.
        later = order[order.index(component) + 1:] + [KUBELET] if component != KUBELET else []
        keep = {}
        for c in later:
            now = _read(ctx, f"{c} of {node.name} ({node.address})", reads[c])
            if now is not None and now.version and c in images:
                keep[c] = now.image or with_tag(images[c], now.version)
        ctx.log(f"{node.address}: {component} {seen.version if seen else '?'} → {target}")
        _apply(ctx, node, held_back(node.config, keep), f"{component} {images[component]}")
        result[component] = _wait(ctx, node, component, target, reads[component]).version
        ctx.log(f"{node.address}: {component} runs {result[component]} and is Ready")
    return result


def _reads(ctx: Context, node: Node) -> dict[str, Callable[[], Seen | None]]:
    reads = {c: (lambda c=c: static_pod(ctx.core, c, node.address)) for c, _ in COMPONENTS}
    reads[KUBELET] = lambda: node_kubelet(ctx.core, node.address)
    return reads


def prepull(ctx: Context, steps: list[Step], target: str) -> list[tuple[str, str]]:
    """Phase 1: pull the target images a step will switch to, talosctl's order (each static-pod
    image on every control plane, CRI namespace; then each kubelet, system namespace). Returns
    (node address, image) of every pull the node made."""
    wanted: list[tuple[Node, str, str]] = []  # node, component, image
    for component in [c for c, _ in COMPONENTS] + [KUBELET]:
        for step in steps:
            node = step.node
            if component not in step.components:
                continue
            image = target_images(node.config).get(component)
            seen = _read(ctx, f"{component} of {node.name} ({node.address})", _reads(ctx, node)[component])
            if image and not _on_target(seen, target):
                wanted.append((node, component, image))
    pulled = []
    for node, component, image in wanted:
        namespace = "system" if component == KUBELET else "cri"
        try:
            done = lifecycle.pre_pull(ctx.client_for(node.address), image, namespace=namespace, timeout=ctx.timeout)
        except TalosError as e:
            raise KubernetesUpgradeError(
                f"{node.name} ({node.address}) could not pull {image} ({e.problem}). This run changed no node: check that "
                "the image exists and the node reaches its registry, then run `pulumi up` again.") from e
        if done:
            pulled.append((node.address, image))
            ctx.log(f"{node.address}: pre-pulled {image}")
        else:
            ctx.log(f"{node.address}: image pull not implemented, skipping {image}")
    return pulled


def sync_manifests(ctx: Context, steps: list[Step]) -> list[str]:
    """Phase 5 from the first control plane of the plan (talosctl's controlPlaneNodes[0])."""
    first = next((s.node for s in steps if s.node.control_plane), None)
    if first is None:
        ctx.log("bootstrap manifests: no control plane in the plan, nothing to sync")
        return []
    return bootstrap_manifests.sync(bootstrap_manifests.Sync(
        talos=ctx.client_for(first.address), api=ctx.core.api_client, log=ctx.log, timeout=ctx.timeout,
        proxy_image=proxy_image(first.config)))


def rollout(ctx: Context, steps: list[Step], target: str) -> dict[str, dict[str, str]]:
    """Pre-pull, run the steps in order, sync the bootstrap manifests; returns node name →
    component → version."""
    prepull(ctx, steps, target)
    versions: dict[str, dict[str, str]] = {}
    for i, step in enumerate(steps, 1):
        ctx.log(f"Kubernetes upgrade step {i}/{len(steps)}: {step.node.name} ({step.node.address}) {step.phase}")
        versions.setdefault(step.node.name, {}).update(run_step(ctx, step, target))
    if ctx.sync_manifests:
        sync_manifests(ctx, steps)
    return versions
