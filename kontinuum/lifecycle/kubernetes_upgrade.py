"""A zone's Kubernetes upgrade, talosctl upgrade-k8s's flow done by us (reference/day2-facts.md
§2, reference/failure-facts.md §4, DESIGN §10). No Pulumi: providers/kubernetes_version.py calls it.

Order (rollout()):
0. pre-flight, for a minor step only: removed flags, feature gates and admission plugins in what
   the nodes run (COSI StaticPods, KubeletSpecs) and in our configs, and removed APIs that still
   have objects (kubernetes_preflight.py); any hit refuses the upgrade, nothing changed;
1. pre-pull: the target images on the nodes that will change, before any node is touched, as
   talosctl does (MachineService.ImagePull): kube-apiserver, kube-controller-manager and
   kube-scheduler on every control plane into the CRI namespace, then the kubelet on every node
   into the system namespace; a node that does not implement it is skipped, any other failure
   stops the rollout there, naming node and image, with nothing changed. We pull exactly the
   images the target config names (talosctl builds the kubelet's from --kubelet-image and keeps
   the node's -fat/-slim suffix; the zone's config already says which one it runs);
2. each control plane one at a time, and on it kube-apiserver → kube-controller-manager →
   kube-scheduler: only that image changes in the node's LIVE config, applied NO_REBOOT
   (image_patch.py), then we wait until the node's static pod carries a new
   `talos.dev/config-version`, runs the target image and is Ready (_wait_static_pod);
3. cluster.proxy.image on every control plane, the same way, without a wait (talosctl's
   phase 3): the bootstrap-manifest sync (5) waits for the manifest it renders;
4. every kubelet node by node, control planes first (machine.kubelet.image), waiting until the
   Node reports the target kubelet version and is Ready;
5. the bootstrap manifests (bootstrap_manifests.py): read from the first control plane,
   server-side applied, and their workloads waited for.
The zone's ConfigApply resources depend on this rollout and apply the full configs after it:
any other pending change of the zone goes there, never with an image step.

Resumable by reading the truth first: a component whose pod already runs the target image and is
Ready, or a kubelet whose Node already reports the target version and is Ready, is skipped
without a call to its node; one whose live config already names the target image (a killed run
patched it) is waited for, never applied again. The pre-pull and the manifest sync, which change
nothing a node runs, are simply done again. Every wait is bounded and names the node and the
component.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable

import yaml
from kubernetes import client

from kontinuum.errors import KontinuumError
from kontinuum.kube.clients import describe_error
from kontinuum.lifecycle import bootstrap_manifests, image_patch, kubernetes_preflight
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
PROXY = "kube-proxy"
CONFIG_VERSION = "talos.dev/config-version"  # the static pod's config resource version (Talos)
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
    pool: str = ""  # the pool whose config it is (messages of the pre-flight name it)


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


# --- what the cluster says (the truth each step reads first) ------------------------------------


@dataclass(frozen=True)
class Seen:
    version: str  # the running image's tag, or the Node's kubelet version ("" when none)
    image: str
    ready: bool
    detail: str  # for messages: what was seen
    config_version: str = ""  # a static pod's talos.dev/config-version ("" for a kubelet)


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
    version = str((pod.metadata.annotations or {}).get(CONFIG_VERSION, ""))
    return Seen(tag_of(container.image), container.image, ready,
                f"pod {pod.metadata.name} runs {container.image} (config version {version or 'none'}), {why}", version)


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


def patch_image(ctx: Context, node: Node, component: str, image: str) -> bool:
    """Set only `component`'s image in the node's live config, applied NO_REBOOT (image_patch.py);
    False, with no apply, when the live config names that image already."""
    return image_patch.apply(ctx.client_for(node.address), f"{node.name} ({node.address})", component, image)


def _wait(ctx: Context, node: Node, component: str, read: Callable[[], Seen | None], done: Callable[[Seen], bool],
          what: str) -> Seen:
    def probe(_left: float) -> Seen:
        try:
            seen = read()
        except Exception as e:  # noqa: BLE001 - an API hiccup under load: try again within the bound
            raise NotYet(f"the cluster API did not answer ({describe_error(e)})") from e
        if seen is None:
            raise NotYet(f"no {component} reported on {node.address} yet")
        if not done(seen):
            raise NotYet(seen.detail)
        return seen

    kind = "Node" if component == KUBELET else "static pod"
    return wait_until(f"{component} on {node.name} ({node.address}) to {what}", probe,
                      timeout=ctx.timeout, bounds=_POLL,
                      remedy=f"Check that node's {component} ({kind} status, its logs); raise timeouts.kubernetesUpgrade "
                             "if it is only slow, then run `pulumi up` again: finished nodes are not touched again.")


def _wait_static_pod(ctx: Context, node: Node, component: str, image: str, before: str | None,
                     read: Callable[[], Seen | None]) -> Seen:
    """Wait until the node's mirror pod of `component` carries a `talos.dev/config-version`
    other than `before` (None: any), runs `image` and is Ready.

    Talos writes the annotation from the version of the component's config resource
    (control_plane_static_pod.go), which goes up with every change of that config. talosctl
    watches that resource for the version our patch produced and waits for it exactly; we compare
    with the version the pod showed before the patch instead: no COSI watch, and a pod that
    changed since the patch and runs the target image can only come from a config at or after
    ours (the image check rules out a rewrite for an older, not yet rolled out change)."""
    def done(seen: Seen) -> bool:
        changed = before is None or (seen.config_version and seen.config_version != before)
        return bool(changed) and seen.image == image and seen.ready

    since = f", with a config version other than {before}" if before is not None else ""
    return _wait(ctx, node, component, read, done, f"run {image}{since} and be Ready")


def _wait_kubelet(ctx: Context, node: Node, target: str, read: Callable[[], Seen | None]) -> Seen:
    return _wait(ctx, node, KUBELET, read, lambda seen: _done(seen, target), f"run {target} and be Ready")


def _move(ctx: Context, node: Node, component: str, image: str, target: str, seen: Seen | None,
          read: Callable[[], Seen | None]) -> Seen:
    """Patch one component's image (unless the live config has it already) and wait for it."""
    changed = patch_image(ctx, node, component, image)
    if component == KUBELET:
        return _wait_kubelet(ctx, node, target, read)
    before = seen.config_version if changed and seen and seen.config_version else None
    return _wait_static_pod(ctx, node, component, image, before, read)


def run_step(ctx: Context, step: Step, target: str) -> dict[str, str]:
    """Bring one node's components of this step to `target`; returns component → version."""
    node = step.node
    images = target_images(node.config)
    reads = _reads(ctx, node)
    result: dict[str, str] = {}
    for component in step.components:
        seen = _read(ctx, f"{component} of {node.name} ({node.address})", reads[component])
        if _done(seen, target) or (_on_target(seen, target) and not ctx.settle_unready):
            ctx.log(f"{node.address}: {component} already runs {seen.version}")
            result[component] = seen.version
            continue
        if component not in images:
            raise KubernetesUpgradeError(f"the zone's machine config for {node.name} names no {component} image")
        ctx.log(f"{node.address}: {component} {seen.version if seen else '?'} → {target}")
        result[component] = _move(ctx, node, component, images[component], target, seen, reads[component]).version
        ctx.log(f"{node.address}: {component} runs {result[component]} and is Ready")
    return result


def upgrade_proxy(ctx: Context, steps: list[Step]) -> None:
    """talosctl's phase 3: cluster.proxy.image on every control plane, no wait (the manifest
    sync waits for the kube-proxy manifest the first control plane renders from it)."""
    for node in dict.fromkeys(s.node for s in steps if s.node.control_plane):
        image = proxy_image(node.config)
        if image and patch_image(ctx, node, PROXY, image):
            ctx.log(f"{node.address}: kube-proxy image → {image}")


def preflight(ctx: Context, steps: list[Step], current: str, target: str) -> None:
    """The pre-flight checks of the step current → target, before anything changes; raises
    kubernetes_preflight.PreflightError naming each hit."""
    nodes = list(dict.fromkeys(s.node for s in steps))
    ctx.log(f"Kubernetes upgrade {current} → {target}: pre-flight checks")
    kubernetes_preflight.check_zone(
        current, target, [kubernetes_preflight.Member(n.name, n.address, n.control_plane, n.pool or n.name, n.config)
                          for n in nodes], ctx.client_for, getattr(ctx.core, "api_client", None))


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


def rollout(ctx: Context, steps: list[Step], target: str, current: str | None = None) -> dict[str, dict[str, str]]:
    """Pre-flight (when `current` is known), pre-pull, the static-pod steps, kube-proxy's image,
    the kubelet steps, the bootstrap-manifest sync; returns node name → component → version."""
    if current:
        preflight(ctx, steps, current, target)
    prepull(ctx, steps, target)
    versions: dict[str, dict[str, str]] = {}
    proxied = False
    for i, step in enumerate(steps, 1):
        if step.phase == KUBELETS and not proxied:
            upgrade_proxy(ctx, steps)
            proxied = True
        ctx.log(f"Kubernetes upgrade step {i}/{len(steps)}: {step.node.name} ({step.node.address}) {step.phase}")
        versions.setdefault(step.node.name, {}).update(run_step(ctx, step, target))
    if not proxied:
        upgrade_proxy(ctx, steps)
    if ctx.sync_manifests:
        sync_manifests(ctx, steps)
    return versions
