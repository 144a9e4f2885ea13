"""ConfigApply: one machine's config in its cluster, from maintenance mode to reset.

One resource per machine, named after its Instance (membership by identity): a change of
pool membership creates or deletes exactly the machines that join or leave.
create: apply in maintenance mode (insecure TLS pinned to the certificate discovery recorded
on the hub Instance, so another machine answering at the address never gets the cluster's
keys; mode auto). A node that already left
maintenance mode refuses that, which is expected on a re-run (seeds: best-effort, logged):
the config is then re-applied over mTLS in auto mode. Either way the wait ends only when the
node answers over mTLS, after its reboot, so the next resource can rely on it.
update: a changed config is applied live over mTLS (no-reboot mode) to exactly this node; a change
that needs a reboot was rolled before by the zone's ConfigRollout (providers/config_rollout.py).
delete: the machine leaves its cluster and is reset to maintenance mode (node_teardown.py).
Every network step is bounded by applyTimeout or resetTimeout; check and diff are pure.
"""

from __future__ import annotations

import time

import pulumi
import yaml
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult

from kontinuum.errors import KontinuumError
from kontinuum.lifecycle import etcd_health
from kontinuum.talos import talosconfig
from kontinuum.talos.errors import (FingerprintMismatchError, NeedsRebootError, NodeUnreachableError, NotInMaintenanceError,
                                    TalosError, TalosTimeoutError, TlsTrustError)
from kontinuum.talos.talosconfig import APID_PORT
from kontinuum.talos.waits import WAIT_DEFAULTS, NotYet, WaitTimeout, wait_until
from providers.common import TypedResource, diff_inputs, with_secret_outputs
from providers.node_teardown import WIPES, teardown
from providers.talos_common import (TRANSIENT, Inputs, config_hash, info, known, machine_inventory,
                                     maintenance_client, node_client, warn)

ROLES = ("controlplane", "worker")
REPLACE_ON = ("instance", "role")
UPDATE_ON = ("address", "pool", "talosPort", "talosconfig", "hubKubeconfig", "applyTimeout", "resetTimeout",
             "resetOnDelete", "leaveEtcdOnDelete", "skipUnreachable", "wipe", "drain", "configView")
SECRET_OUTPUTS = ("config", "talosconfig", "hubKubeconfig")


def check_config_apply(news: dict, olds: dict | None = None) -> Inputs:
    inputs = Inputs(news)
    inputs.string("address", "the node's address (the one discovery answered on)")
    if inputs.news.get("wipe") is None:
        inputs.news["wipe"] = "state"
    inputs.string("wipe", "what a reset wipes", choices=tuple(WIPES))
    _check_stays_in_pool(inputs, olds or {})
    inputs.port()
    inputs.string("role", "the node's role", choices=ROLES)
    inputs.talosconfig()
    inputs.seconds("applyTimeout", WAIT_DEFAULTS.apply)
    inputs.seconds("resetTimeout", WAIT_DEFAULTS.reset)
    inputs.flag("resetOnDelete", True)
    inputs.flag("skipUnreachable", False)
    inputs.flag("drain", True)
    role = inputs.news.get("role")
    inputs.flag("leaveEtcdOnDelete", role == "controlplane" if role in ROLES else None)
    config = inputs.secret_text("config", "the rendered machine config")
    if config is not None and role in ROLES:
        problem = _config_role_problem(config, role)
        if problem:
            inputs.fail("config", problem)
    return inputs


def _check_stays_in_pool(inputs: Inputs, olds: dict) -> None:
    """A machine that holds a cluster's data does not change pool or role in place: refused at
    check (so in preview), with the safe way."""
    news = inputs.news
    for prop in ("pool", "role"):
        old, new = olds.get(prop), news.get(prop)
        if old and known(new) and new and new != old:
            inputs.fail(prop, (
                f"machine {news.get('instance') or news.get('address')} is a member of {prop} {old!r} and holds its "
                f"data; it cannot move to {new!r} in place. Remove it from the zone first (`pulumi up` resets it to "
                "maintenance mode), then list it in the other pool and run `pulumi up` again."))


def _config_role_problem(config: str, role: str) -> str | None:
    """The config must be a v1alpha1 document for this role; names types, never values."""
    try:
        docs = [d for d in yaml.safe_load_all(config) if isinstance(d, dict)]
    except yaml.YAMLError as exc:  # the message would quote the line: say only where
        mark = getattr(exc, "problem_mark", None)
        return "not valid YAML" + (f" (line {mark.line + 1})" if mark else "")
    machine = next((d.get("machine") for d in docs if d.get("version") == "v1alpha1"), None)
    if not isinstance(machine, dict):
        return "holds no v1alpha1 machine config document"
    kind = machine.get("type") or "worker"
    kind = {"init": "controlplane", "join": "worker"}.get(kind, kind)
    if kind != role:
        return f"is a {kind} config but role is {role}"
    return None


def diff_config_apply(olds: dict, news: dict) -> DiffResult:
    """olds are the recorded outputs, which hold the config's hash, never the config."""
    if olds.get("instance") is None and olds.get("address") == news.get("address"):
        olds = {**olds, "instance": news.get("instance")}  # recorded before identities: the same machine
    result = diff_inputs(olds, news, replace_on=REPLACE_ON, update_on=UPDATE_ON)
    new_config = news.get("config")
    if not known(new_config) or olds.get("configHash") != config_hash(new_config or ""):
        result.changes = True
    return result


# --- create / update --------------------------------------------------------------------------


def _recorded_fingerprint(props: dict) -> str | None:
    """The maintenance certificate discovery (or our last reset) recorded for this machine."""
    inv = machine_inventory(props)
    if inv is None:
        return None
    from kontinuum.hub.discovery import recorded

    fingerprint = recorded(inv.get(props["instance"]))["fingerprint"]
    if fingerprint is None:
        warn(f"{props['address']}: Instance {props['instance']} has no recorded certificate; pinning the first one seen")
    return fingerprint


def _not_this_machine(props: dict, exc: FingerprintMismatchError) -> KontinuumError:
    return KontinuumError(
        f"ConfigApply {props['address']}: the machine answering in maintenance mode presents certificate "
        f"{exc.seen}, but discovery recorded {exc.pinned} for Instance {props.get('instance')}. Another machine "
        "may answer at this address: it gets no config. If it is the same machine and it rebooted since discovery "
        "(each maintenance boot has a new certificate), discover it again: `pulumi up --replace <its Instance URN>` "
        "(see `pulumi stack --show-urns`), then run `pulumi up`."
    )


def _foreign(props: dict, exc: TlsTrustError) -> KontinuumError:
    return KontinuumError(
        f"ConfigApply {props['address']}: the node has a config, but its certificate does not verify against "
        f"this cluster's talosconfig ({exc.problem}). It belongs to another cluster, or another machine answers "
        "at this address. Reset that machine to maintenance mode (talosctl reset) or take it out of this pool, "
        "then run again."
    )


def _needs_reboot(props: dict) -> KontinuumError:
    return KontinuumError(
        f"ConfigApply {props['address']}: the node refuses its changed config without a reboot. "
        "Reboots for a config change are made only by the zone's ConfigRollout, one node at a time; it runs before "
        "every ConfigApply and asks each node first, so the node's answer changed in between. Nothing was applied; "
        "run `pulumi up` again.")


def _apply_once(props: dict, left: float, *, prefer_mtls: bool, fingerprint: str | None = None) -> str:
    """Send the config once, however the node takes it now: "maintenance", or the mode the
    node chose over mTLS. Raises TRANSIENT errors while the node is off the network."""
    address = props["address"]
    mtls = node_client(props)
    timeout = min(left, mtls.deadlines.apply_config)
    if prefer_mtls:
        try:
            result = mtls.apply_config(props["config"], mode="no-reboot", timeout=timeout)
            info(f"{address}: applied the changed config live over mTLS (no-reboot mode)")
            return result.mode
        except TlsTrustError as exc:
            info(f"{address}: no mTLS answer ({exc.problem}); trying maintenance mode")
        except NeedsRebootError as exc:
            raise _needs_reboot(props) from exc
    try:
        maintenance_client(props, fingerprint).apply_config(props["config"], mode="auto", timeout=timeout)
        info(f"{address}: applied the config in maintenance mode; the node installs and reboots")
        return "maintenance"
    except FingerprintMismatchError as exc:
        raise _not_this_machine(props, exc) from exc
    except NotInMaintenanceError as exc:
        # Expected on a re-run: the node moved on (seeds, best-effort). Converge over mTLS.
        info(f"{address}: maintenance-mode apply refused as expected for a configured node ({exc.problem})")
    try:
        result = mtls.apply_config(props["config"], mode="auto", timeout=timeout)
    except TlsTrustError as exc:
        raise _foreign(props, exc) from exc
    info(f"{address}: re-applied the config over mTLS (auto mode; the node chose {result.mode})")
    return result.mode


def _wait_answers(props: dict, started: float, after_reboot: bool) -> None:
    """Wait until the node answers over mTLS; after a reboot-mode apply, first see it go down
    (briefly bounded: a reboot we miss must not stall the run)."""
    client = node_client(props)
    address = props["address"]
    bound = float(props["applyTimeout"])
    if after_reboot:

        def down(left: float) -> None:
            try:
                client.version(timeout=min(left, client.deadlines.version))
            except TalosError:
                return
            raise NotYet("still answering")

        try:
            wait_until(f"{address} to go down for its reboot", down, timeout=WAIT_DEFAULTS.reboot_notice, remedy="")
        except WaitTimeout:
            notice = WAIT_DEFAULTS.reboot_notice
            warn(f"{address}: did not see the node go down for its reboot within {notice:g} s; continuing")

    def up(left: float) -> None:
        try:
            client.version(timeout=min(left, client.deadlines.version))
        except TRANSIENT as exc:
            raise NotYet(exc.problem) from exc

    wait_until(
        f"ConfigApply {address}: the node to answer over mTLS with its new config",
        up,
        timeout=bound,
        started=started,
        remedy=(
            "The node may still be installing or rebooting (raise applyTimeout), or it did not take the config "
            "(check its console); then run `pulumi up` again."
        ),
    )


def converge(props: dict, *, prefer_mtls: bool) -> dict:
    """Apply props["config"] to the node and wait until it answers over mTLS, all within
    applyTimeout."""
    started = time.monotonic()
    fingerprint = None if prefer_mtls else _recorded_fingerprint(props)

    def attempt(left: float) -> str:
        try:
            return _apply_once(props, left, prefer_mtls=prefer_mtls, fingerprint=fingerprint)
        except TRANSIENT as exc:
            raise NotYet(exc.problem) from exc

    mode = wait_until(
        f"ConfigApply {props['address']}: the node to accept its machine config",
        attempt,
        timeout=float(props["applyTimeout"]),
        started=started,
        remedy="Check that the machine is on and reachable on its Talos port, then run `pulumi up` again.",
    )
    _wait_answers(props, started, after_reboot=mode == "reboot")
    if props.get("role") == "controlplane" and not prefer_mtls:
        _wait_joined(props, started)
    return outputs(props)


def _wait_joined(props: dict, started: float) -> None:
    """A control plane joining a running cluster: wait (applyTimeout) until etcd is healthy with
    it as a member, so the next one joins only then (the zone chains control-plane applies).
    Before the cluster is bootstrapped there is no etcd to join: nothing to wait for."""
    address = props["address"]
    others = [e for e in talosconfig.parse(props["talosconfig"]).endpoints if e != address]
    try:
        found = etcd_health.members(lambda a: node_client(props, a), others, 10.0)
    except NotYet:
        info(f"{address}: no other control plane runs etcd yet; it joins at bootstrap")
        return
    expected = sorted({etcd_health.member_address(m) for m in found} | {address})
    left = max(float(props["applyTimeout"]) - (time.monotonic() - started), 1.0)
    etcd_health.wait_healthy(lambda a: node_client(props, a), expected, timeout=left,
                             why=f"with control plane {address} joined")
    info(f"{address}: joined etcd; members {expected} are healthy")


def outputs(props: dict) -> dict:
    """Everything but the config itself, which only its hash represents."""
    outs = {k: props.get(k) for k in ("instance", "role", *UPDATE_ON)}
    outs["configHash"] = config_hash(props["config"])
    return outs


# --- read (pulumi refresh): what the node runs now --------------------------------------------

READ_TIMEOUT = 10.0  # seconds per call when refreshing: a node that does not answer is reported
DRIFT = "drift: "  # configHash of a node found without this cluster's config; the next up re-applies


def observe(props: dict, timeout: float = READ_TIMEOUT) -> str:
    """"configured" (answers over mTLS with this cluster's identity), "maintenance" (reset out of
    band), "foreign" (another identity answers) or "unreachable"."""
    try:
        node_client(props).version(timeout=timeout)
        return "configured"
    except TlsTrustError:
        pass
    except (NodeUnreachableError, TalosTimeoutError):
        return "unreachable"
    try:
        maintenance_client(props).discover(timeout=timeout)
        return "maintenance"
    except (NodeUnreachableError, TalosTimeoutError):
        return "unreachable"
    except TalosError:
        return "foreign"


def read_config_apply(props: dict) -> dict:
    """The recorded outputs, with configHash marked as drift when the node no longer runs this
    cluster's config (so the next `pulumi up` applies it again). A node that does not answer
    keeps its record and is reported."""
    address = props.get("address")
    seen = observe(props)
    if seen == "configured":
        return props
    if seen == "unreachable":
        warn(f"ConfigApply {address}: the node did not answer within {READ_TIMEOUT:g} s; its config was not compared")
        return props
    why = ("the node is in maintenance mode (reset out of band)" if seen == "maintenance" else
           "the node answers with another cluster's identity (reconfigured out of band)")
    warn(f"ConfigApply {address}: {DRIFT}{why}; the next `pulumi up` applies its config again")
    return {**props, "configHash": DRIFT + why}


class ConfigApplyProvider(ResourceProvider):
    def check(self, olds, news):
        return check_config_apply(news, olds).result()

    def diff(self, _id, olds, news):
        return diff_config_apply(olds, news)

    def create(self, props):
        return CreateResult(id_=props.get("instance") or props["address"], outs=converge(props, prefer_mtls=False))

    def update(self, _id, olds, news):
        if olds.get("configHash") == config_hash(news["config"]):
            return UpdateResult(outs=outputs(news))  # settings only: nothing to send
        return UpdateResult(outs=converge(news, prefer_mtls=True))

    def read(self, id_, props):
        return ReadResult(id_=id_, outs=read_config_apply(props))

    def delete(self, _id, props):
        teardown(props)


class ConfigApply(TypedResource, module="talos", name="ConfigApply"):
    """A machine config applied to one machine (its Instance). Outputs: instance, address, role,
    configHash (sha256 of the config; the config itself is never an output), configView (the
    config as path → value with every secret masked, kontinuum/talos/config_view.py: what a
    preview shows of a config change), talosconfig and hubKubeconfig (secrets, for teardown)."""

    address: pulumi.Output[str]
    configHash: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        address: pulumi.Input[str],
        config: pulumi.Input[str],
        talosconfig: pulumi.Input[str],
        role: pulumi.Input[str],
        config_view: pulumi.Input[dict] | None = None,
        instance: str | None = None,
        pool: str | None = None,
        hub_kubeconfig: pulumi.Input[str] | None = None,
        wipe: str = "state",
        drain: bool = True,
        talos_port: pulumi.Input[int] = APID_PORT,
        apply_timeout: pulumi.Input[float] = WAIT_DEFAULTS.apply,
        reset_timeout: pulumi.Input[float] = WAIT_DEFAULTS.reset,
        reset_on_delete: pulumi.Input[bool] = True,
        leave_etcd_on_delete: pulumi.Input[bool] | None = None,
        skip_unreachable: pulumi.Input[bool] = False,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "instance": instance,  # the machine's hub Instance: its identity
            "pool": pool,
            "address": address,
            "hubKubeconfig": pulumi.Output.secret(hub_kubeconfig) if hub_kubeconfig is not None else None,
            "wipe": wipe,
            "drain": drain,  # cordon and drain its Node before a reset
            "talosPort": talos_port,
            "config": pulumi.Output.secret(config),
            "configView": config_view,  # redacted: not a secret, so a preview can show it
            "talosconfig": pulumi.Output.secret(talosconfig),
            "role": role,
            "applyTimeout": apply_timeout,
            "resetTimeout": reset_timeout,
            "resetOnDelete": reset_on_delete,
            "leaveEtcdOnDelete": leave_etcd_on_delete,  # None: true for control planes (check fills it)
            "skipUnreachable": skip_unreachable,
            "configHash": None,
        }
        super().__init__(ConfigApplyProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_OUTPUTS))
