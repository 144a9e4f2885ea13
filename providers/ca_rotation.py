"""CaRotation: takes a zone's nodes from the retiring CA to the bundle's new one (talosctl
rotate-ca's phases, kontinuum/talos/rotate.py), then hands the bundle and talosconfig on.

It sits between TalosSecrets and everything that talks to the nodes: ConfigApply renders from
its `secretsYaml`, and Bootstrap, Kubeconfig, health and upgrades use its `talosconfig`, so
nothing downstream sees the new CA before the nodes trust it, and the clients switch (the
Kubeconfig re-issues from the new CA, the zone's Kubernetes provider follows) right after.

A rotation is due for a kind when TalosSecrets retired a CA under the current token and this
resource has not recorded that token as done. The phases read the nodes' live configs, so a
killed up resumes where the nodes are. The diff prints the phase plan (a preview shows it).
"""

from __future__ import annotations

import pulumi
import yaml
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from kontinuum.talos import ca_rotation, secrets
from kontinuum.talos.pki import CertKey
from kontinuum.talos.talosconfig import APID_PORT
from providers.common import TypedResource, with_secret_outputs
from providers.talos_common import Inputs, info, known

PASS_THROUGH = ("secretsYaml", "talosconfig")
SECRET_OUTPUTS = ("secretsYaml", "talosconfig", "retiringYaml")
DEFAULT_TIMEOUT = 900.0


def due(props: dict, done: dict) -> list[str]:
    """Kinds whose token has a retired CA and is not recorded as rotated (Talos first, as talosctl)."""
    tokens = props.get("rotate") or {}
    retiring = props.get("retiringYaml")
    if not known(retiring):  # preview of a changed token: TalosSecrets will retire one
        return [k for k in ca_rotation.KINDS if tokens.get(k) and tokens.get(k) != done.get(k)]
    held = yaml.safe_load(retiring or "") or {}
    return [k for k in ca_rotation.KINDS
            if tokens.get(k) and (held.get(k) or {}).get("token") == tokens.get(k) and done.get(k) != tokens.get(k)]


def _nodes(props: dict) -> list:
    from kontinuum.talos import rotate  # the rotation's clients load where it runs, not in the program

    return [rotate.Node(str(n["address"]), bool(n["controlPlane"])) for n in props.get("nodes") or []]


def _run(props: dict, done: dict) -> dict:
    from kontinuum.talos import rotate

    kinds = due(props, done)
    done = dict(done)
    if kinds:
        bundle = secrets.load(props["secretsYaml"], check_rsa=False)
        held = yaml.safe_load(props["retiringYaml"]) or {}
        retired = {k: CertKey(held[k]["crt"].encode(), held[k]["key"].encode()) for k in kinds}
        talos_cas = [bundle.os, *([retired["talos"]] if "talos" in retired else [])]
        zone = rotate.Zone(name=props["clusterName"], nodes=_nodes(props), talos_cas=talos_cas,
                           k8s_endpoint=props["k8sEndpoint"], port=int(props.get("talosPort") or APID_PORT),
                           timeout=float(props.get("timeout") or DEFAULT_TIMEOUT), log=info)
        for kind in kinds:
            new = bundle.os if kind == "talos" else bundle.k8s
            rotate.run(zone, rotate.Rotation(kind, retired[kind], new))
            done[kind] = (props.get("rotate") or {})[kind]
            if kind == "talos":  # the old Talos CA is dropped: only the new one is in use from here
                zone.talos_cas = [bundle.os]
    for kind, token in (props.get("rotate") or {}).items():
        done.setdefault(kind, token)  # a token with nothing retired (e.g. a new zone) is done as is
    return {**{k: props.get(k) for k in (*PASS_THROUGH, "rotate", "clusterName", "nodes", "talosPort",
                                         "k8sEndpoint", "timeout", "retiringYaml")}, "done": done}


class CaRotationProvider(ResourceProvider):
    def check(self, _olds, news):
        inputs = Inputs(news)
        inputs.string("clusterName", "the cluster name")
        inputs.string("k8sEndpoint", "the Kubernetes API endpoint")
        inputs.port()
        inputs.seconds("timeout", DEFAULT_TIMEOUT)
        return inputs.result()

    def diff(self, _id, olds, news):
        kinds = due(news, olds.get("done") or {})
        if kinds:
            order = [n["address"] for n in (news.get("nodes") or []) if isinstance(n, dict) and known(n.get("address"))]
            for line in ca_rotation.plan(kinds, order or ["every node"]):
                info(f"CA rotation of {news.get('clusterName')}: {line}")
        # Only what it hands on, or a due rotation, is a change: membership or timeouts alone are
        # read from the inputs when a rotation runs, no reason for an update. retiringYaml changes
        # only with a token (`rotate`); a TalosSecrets made before it had that output previews it
        # as unknown on every run, which must not read as a change.
        changed = any(olds.get(k) != news.get(k) for k in (*PASS_THROUGH, "rotate"))
        # What it hands on is its inputs (known at preview as they are); `done` changes only when a
        # rotation runs or a new kind's token is recorded.
        done = olds.get("done") or {}
        tokens = news.get("rotate") or {}
        stable = ["done"] if not kinds and known(tokens) and all(k in done for k in tokens) else []
        return DiffResult(changes=bool(kinds) or changed, stables=stable or None)

    def create(self, props):
        return CreateResult(id_=props["clusterName"], outs=_run(props, {}))

    def update(self, _id, olds, news):
        return UpdateResult(outs=_run(news, olds.get("done") or {}))


class CaRotation(TypedResource, module="talos", name="CaRotation"):
    """Outputs: secretsYaml and talosconfig (secret), TalosSecrets' once the nodes trust them;
    done: the rotation tokens carried out."""

    secretsYaml: pulumi.Output[str]
    talosconfig: pulumi.Output[str]
    done: pulumi.Output[dict]

    def __init__(self, resource_name: str, *, cluster_name: pulumi.Input[str], rotate_tokens: dict,
                 secrets_yaml: pulumi.Input[str], retiring_yaml: pulumi.Input[str], talosconfig: pulumi.Input[str],
                 nodes: pulumi.Input[list], k8s_endpoint: pulumi.Input[str], talos_port: pulumi.Input[int] = APID_PORT,
                 timeout: pulumi.Input[float] = DEFAULT_TIMEOUT, opts: pulumi.ResourceOptions | None = None):
        props = {
            "clusterName": cluster_name,
            "rotate": dict(rotate_tokens),
            "secretsYaml": pulumi.Output.secret(secrets_yaml),
            "retiringYaml": pulumi.Output.secret(retiring_yaml),
            "talosconfig": pulumi.Output.secret(talosconfig),
            "nodes": nodes,
            "k8sEndpoint": k8s_endpoint,
            "talosPort": talos_port,
            "timeout": timeout,
            "done": None,
        }
        super().__init__(CaRotationProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_OUTPUTS))

