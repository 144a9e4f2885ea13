"""Zone bring-up by phase, from the engine's event log, and the lab's floor for each phase.

Every resource step shows up twice in `pulumi up --event-log FILE`: resourcePreEvent when the
engine starts it and resOutputsEvent when it is done. We stamp each event when it appears
in the log (bench.event_log.EventTail, ~20 ms resolution; the engine's own stamps are whole
seconds). A resource belongs to the zone whose Zone component is its ancestor (the `parent`
links in the events' state metadata); its phase comes from its name within the zone
(`<region>-<zone>-<suffix>`, DESIGN §4; the Gateway API CRDs are `…-gateway-api-<crd>`).

A phase *ends* when its last resource is done. The phases form a chain (each depends on the
one before), so a zone's bring-up splits into increments: end(phase) − end(previous phase),
the first measured from the start of `pulumi up`. Resources off the chain (ZoneIdentity,
providers) run in parallel and are not charged to any phase.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.common import ROOT
from bench.event_log import Event

PHASES = [
    ("startup", "engine + program start (up → first resource registered)"),
    ("discovery", "discovery (Instance: register + maintenance probe)"),
    ("claim", "claim (InstancePool CAS)"),
    ("secrets", "Talos secrets (local; not in the issue's list)"),
    ("apply", "apply (ConfigApply, node reboots)"),
    ("bootstrap", "bootstrap"),
    ("kubeconfig", "kubeconfig (apiserver up)"),
    ("cilium", "Cilium healthy (Gateway API CRDs, release, pods)"),
    ("health", "cluster health (Talos HealthCheck)"),
    ("certmanager", "cert-manager healthy (release, pods)"),
    ("downstream", "downstream footprint (Certificate Ready, HTTPRoute)"),
    ("join", "registry join (heartbeat)"),
]
PHASE_NAMES = [p for p, _ in PHASES]

DOWNSTREAM = {"namespace", "env-secret", "env-configmap", "identity-secret", "hub-identity", "deployment", "service",
              "cluster-issuer", "gateway", "certificate", "certificate-ready", "httproute"}


def classify(suffix: str, urn: str = "") -> str | None:
    """The phase of a zone resource from its name suffix; a machine's Instance (discovery) and
    its ConfigApply (apply, a child of the TalosCluster) share the machine's name."""
    if suffix.startswith("gateway-api-"):  # one resource per Gateway API CRD
        return "cilium"
    if re.fullmatch(r"[0-9a-f]{8}", suffix):
        return "apply" if "TalosCluster$pulumi-python:dynamic/talos:ConfigApply::" in urn else "discovery"
    if suffix == "controlplane":
        return "claim"
    if suffix == "secrets":
        return "secrets"
    if suffix in ("bootstrap", "kubeconfig", "health", "join"):
        return suffix
    if suffix in ("cilium", "cilium-healthy", "gateway-api"):
        return "cilium"
    if suffix in ("cert-manager", "cert-manager-healthy"):
        return "certmanager"
    if suffix in DOWNSTREAM:
        return "downstream"
    return None  # identity, providers, components: off the chain


def _meta_urns(e: Event) -> tuple[str, str | None, str]:
    md = e.data.get("metadata") or {}
    urn = md.get("urn", "")
    state = md.get("new") or md.get("old") or {}
    return urn, state.get("parent") or None, md.get("type", "")


@dataclass
class ZoneTimes:
    zone: str
    ends: dict[str, float] = field(default_factory=dict)  # phase -> time.time() its last resource was done
    starts: dict[str, float] = field(default_factory=dict)  # phase -> first resourcePreEvent
    busy: dict[str, float] = field(default_factory=dict)  # phase -> summed create time of its resources
    failed: list[str] = field(default_factory=list)
    steps: list[tuple[str, str, float, float]] = field(default_factory=list)  # (phase, resource, start, end)

    def increments(self, t0: float) -> dict[str, float]:
        out, prev = {}, t0
        for p in PHASE_NAMES:
            if p in self.ends:
                out[p] = self.ends[p] - prev
                prev = self.ends[p]
        return out

    def total(self, t0: float) -> float | None:
        return self.ends["join"] - t0 if "join" in self.ends else None


def zone_times(events: list[Event], region: str) -> dict[str, ZoneTimes]:
    parent: dict[str, str | None] = {}
    for e in events:
        if e.kind in ("resourcePreEvent", "resOutputsEvent", "resOpFailedEvent"):
            urn, par, _ = _meta_urns(e)
            if urn and (par or urn not in parent):
                parent[urn] = par

    def zone_of(urn: str) -> str | None:
        seen = 0
        while urn and seen < 20:
            if urn.split("::")[-2].endswith("kontinuum:index:Zone"):
                return urn.rsplit("::", 1)[-1].removeprefix(f"{region}-")
            urn = parent.get(urn) or ""
            seen += 1
        return None

    out: dict[str, ZoneTimes] = {}
    pre: dict[str, float] = {}
    first = min((e.t for e in events if e.kind == "resourcePreEvent"), default=None)
    for e in events:
        if e.kind not in ("resourcePreEvent", "resOutputsEvent", "resOpFailedEvent"):
            continue
        urn, _, _ = _meta_urns(e)
        if not urn:
            continue
        zone = zone_of(urn)
        if zone is None:
            continue
        name = urn.rsplit("::", 1)[-1]
        phase = classify(name.removeprefix(f"{region}-{zone}-"), urn)
        if phase is None:
            continue
        zt = out.setdefault(zone, ZoneTimes(zone))
        if first is not None:
            zt.ends["startup"] = first
        if e.kind == "resourcePreEvent":
            pre[urn] = e.t
            zt.starts[phase] = min(zt.starts.get(phase, e.t), e.t)
        elif e.kind == "resOutputsEvent":
            zt.ends[phase] = max(zt.ends.get(phase, e.t), e.t)
            if urn in pre:
                zt.busy[phase] = zt.busy.get(phase, 0.0) + e.t - pre[urn]
                zt.steps.append((phase, name.removeprefix(f"{region}-{zone}-"), pre[urn], e.t))
        else:
            zt.failed.append(f"{phase}: {name}")
    return out


# -- the lab's floor -----------------------------------------------------------------------------


def _kwok_delay_means() -> dict[str, float]:
    """Mean delay (duration + jitter/2) of each kwok Stage the lab configures, in seconds."""
    out = {}
    for doc in yaml.safe_load_all((ROOT / "lab" / "kwok" / "stages.yaml").read_text()):
        if not doc:
            continue
        d = (doc.get("spec") or {}).get("delay") or {}
        out[doc["metadata"]["name"]] = (d.get("durationMilliseconds", 0) + d.get("jitterDurationMilliseconds", 0) / 2) / 1000
    return out


def _default(cls, param: str) -> float:
    return float(inspect.signature(cls.__init__).parameters[param].default)


def lab_floor(reboot_delay: float, control_plane_start: float | None, cert_manager_start: float | None = None,
              issuance: float | None = None) -> dict[str, tuple[float | None, str]]:
    """Seconds the lab itself imposes per phase (expected values), with how they were derived.
    Real processes are part of the lab too. Measured, per zone: the control plane start
    (bootstrap → the apiserver serves HTTP), the real cert-manager webhook's start (process
    started → its API admits a dry-run Certificate) and the real ACME issuance (the Certificate
    created → cert-manager sets it Ready, Pebble validating through the lab's Gateway); the rest,
    kube-controller-manager and kube-scheduler included, counts as ours."""
    from lab.standins.kontinuum_server import KontinuumServer

    kwok = _kwok_delay_means()
    pod = kwok.get("lab-pod-create", 0) + kwok.get("lab-pod-ready", 0)
    server = _default(KontinuumServer, "interval")
    cp = control_plane_start
    cm = None if cert_manager_start is None else pod + cert_manager_start
    return {
        "startup": (0.0, "none: the lab is not involved"),
        "discovery": (0.0, "no latency knob set: one RPC"),
        "claim": (0.0, "hub writes only"),
        "secrets": (0.0, "local computation"),
        "apply": (reboot_delay, f"the node's reboot delay ({reboot_delay:g} s) after the maintenance apply"),
        "bootstrap": (0.0, "the emulator answers at once"),
        "kubeconfig": (cp, "the lab's control-plane start: bootstrap done → its kube-apiserver serves HTTP "
                       "(polled every 100 ms by the bench)" if cp is not None else "apiserver readiness not observed"),
        "cilium": (pod, f"kwok pod create + ready stage delays, means ({pod:.2f} s)"),
        "health": (0.0, "the lab marks a node CNI-ready on its 1 s tick, usually while Cilium is awaited"),
        "certmanager": (cm, f"kwok pod create + ready stage delays ({pod:.2f} s) + the real webhook's start: process "
                        "started → its API admits a dry-run Certificate (lab log, median)" if cm is not None
                        else "the real cert-manager's start not observed"),
        "downstream": (issuance, "the real ACME issuance: Certificate created (its step's outputs event) → "
                       "cert-manager sets it Ready (its log), median" if issuance is not None
                       else "issuance not observed"),
        "join": (server / 2, f"the kontinuum-server stand-in's poll ({server:g} s), mean wait half of it; it "
                 "heartbeats at once when the Deployment is available"),
    }


def describe_failures(zts: dict[str, ZoneTimes]) -> str:
    return "; ".join(f"zone {z}: {', '.join(zt.failed)}" for z, zt in zts.items() if zt.failed)


def load_log(path: Path):
    """Re-read a saved event log (engine stamps only) for offline inspection."""
    out = []
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        kind = next((k for k in doc if k.endswith("Event")), "?")
        out.append(Event(float(doc.get("timestamp") or 0), int(doc.get("timestamp") or 0), kind, doc.get(kind) or {}))
    return out
