"""TalosSecrets: a cluster's secrets bundle and admin talosconfig; the bundle is issued once.

create generates a bundle (or imports an operator's `talosctl gen secrets` file) and issues
the os:admin client certificate of the talosconfig. An update (cluster name or endpoints
changed) renders the talosconfig again around the SAME certificate, read back from the
previous talosconfig, unless that certificate expires within `renewBeforeDays`: then the diff
reports a change on its own and the update issues a new one from the bundle's OS CA
(kontinuum/talos/renewal.py), before anything downstream uses it. check rejects a changed
import on an existing resource; diff never replaces. No I/O anywhere: nothing here talks to a
node.

CA rotation (`rotate`: kind -> token): a changed token makes a new CA of that kind the bundle's
and keeps the old one in `retiringYaml` (secret) until the next rotation of that kind; the
CaRotation resource takes the nodes from one to the other and only then hands the bundle on.
"""

from __future__ import annotations

import dataclasses

import pulumi
import yaml
from pulumi.dynamic import CreateResult, ResourceProvider, UpdateResult

from kontinuum.errors import ConfigError
from kontinuum.talos import ca_rotation, pki, renewal, secrets, talosconfig
from kontinuum.talos.pki import CertKey
from providers.common import TypedResource, diff_inputs, with_secret_outputs
from providers.talos_common import Inputs, info, known

UPDATE_ON = ("clusterName", "endpoints")
SECRET_OUTPUTS = ("secretsYaml", "talosconfig", "importYaml", "retiringYaml")


def _canonical(import_yaml: str | None) -> str:
    """The bundle an import stands for, so reformatting the same file is no change."""
    return secrets.dump(secrets.load(import_yaml)) if import_yaml else ""


def check_secrets(olds: dict, news: dict) -> Inputs:
    inputs = Inputs(news)
    inputs.string("clusterName", "the cluster name (the talosconfig context)")
    inputs.strings("endpoints", "Talos API endpoints (control-plane addresses)")
    new_import = news.get("importYaml")
    if not known(new_import):
        return inputs
    if new_import is not None and not isinstance(new_import, str):
        inputs.fail("importYaml", "must be the text of a talosctl secrets.yaml (secret)")
        return inputs
    try:
        canonical = _canonical(new_import)
    except ConfigError as exc:  # names the field, never its value
        inputs.fail("importYaml", f"not a talosctl secrets.yaml: {exc}")
        return inputs
    if olds and known(olds.get("importYaml")):
        try:
            before = _canonical(olds.get("importYaml"))
        except ConfigError:
            before = None
        if before != canonical:
            inputs.fail(
                "importYaml",
                "Talos secrets are issued once and never rotated, but this input differs from the one the "
                "cluster was created with (changed, added or removed). Restore the previous value; adopting "
                "another bundle means a new cluster identity, i.e. destroying and recreating the cluster.",
            )
    return inputs


def _render(props: dict, bundle: secrets.SecretsBundle, client: CertKey) -> str:
    return talosconfig.render(props["clusterName"], list(props["endpoints"]), [], bundle.os.crt, client)


class TalosSecretsProvider(ResourceProvider):
    def check(self, olds, news):
        return check_secrets(olds, news).result()

    def diff(self, _id, olds, news):
        d = diff_inputs(olds, news, update_on=UPDATE_ON)  # nothing here is ever replaced
        if not d.changes and (_renewal_due(olds, news) or (olds.get("rotate") or {}) != (news.get("rotate") or {})):
            d.changes = True
        d.stables = stable_outputs(olds, news) if d.changes else None
        return d

    def create(self, props):
        # Tokens present when the zone is made are recorded: a new cluster has nothing to rotate.
        bundle = secrets.load(props["importYaml"]) if props.get("importYaml") else secrets.generate()
        client = talosconfig.issue_client_cert(bundle.os)
        return CreateResult(id_=props["clusterName"], outs=_outputs(props, secrets.dump(bundle), bundle, client, ""))

    def update(self, _id, olds, news):
        bundle = secrets.load(olds["secretsYaml"], check_rsa=False)  # our own state
        previous = talosconfig.parse(olds["talosconfig"])
        client = CertKey(previous.crt, previous.key)
        started = _started(olds, news)
        if "rotate" not in olds and (news.get("rotate") or {}):
            info(f"{news['clusterName']}: certificates.rotate recorded; this zone was made before CA rotation, "
                 "so its tokens rotate nothing now: change one in a later up to rotate that CA")
        bundle, retiring = _start_rotations(bundle, olds, news)
        if renewal.due(previous.crt, _renew_before(news)) or "talos" in started:
            client = renewal.renew_talosconfig_cert(bundle.os)
        secrets_yaml = secrets.dump(bundle) if started else olds["secretsYaml"]  # the bundle as stored
        return UpdateResult(outs=_outputs(news, secrets_yaml, bundle, client, retiring))


def stable_outputs(olds: dict, news: dict) -> list[str]:
    """What this update cannot change, so a preview keeps it known (providers/previews.py): the
    bundle and the retiring CAs unless a token starts a rotation, the Kubernetes CA unless that
    rotation is a Kubernetes one; the talosconfig unless it is
    renewed, its Talos CA rotated, or it names another cluster or endpoints. A token recorded,
    removed after its rotation, or a renewal window moved changes only the record."""
    if not known(news.get("rotate")):
        return []
    started = _started(olds, news)
    stable = [] if started else ["secretsYaml", *(["retiringYaml"] if isinstance(olds.get("retiringYaml"), str) else [])]
    if "kubernetes" not in started and isinstance(olds.get("kubernetesCa"), str):
        stable.append("kubernetesCa")
    if not (_renewal_due(olds, news) or "talos" in started or not known(news.get("renewBeforeDays"))):
        stable.append("talosconfigExpires")
        if all(known(news.get(k)) and olds.get(k) == news.get(k) for k in UPDATE_ON):
            stable.append("talosconfig")
    return stable


def _started(olds: dict, news: dict) -> list[str]:
    """CA kinds whose rotation token changed (set, or changed to another value). A state from
    before CA rotation (no `rotate` recorded) starts none: its first tokens are recorded as a new
    zone's are, so a rotation never runs in the up that first gives the zone's Kubernetes provider
    its clusterIdentifier (a new CA in the kubeconfig while the identifier is added would replace it)."""
    if "rotate" not in olds:
        return []
    before, now = olds.get("rotate") or {}, news.get("rotate") or {}
    return [k for k in ca_rotation.KINDS if now.get(k) and now.get(k) != before.get(k)]


def _start_rotations(bundle: secrets.SecretsBundle, olds: dict, news: dict) -> tuple[secrets.SecretsBundle, str]:
    """A changed token: a new CA of that kind becomes the bundle's (what every node ends on),
    the old one is kept as retiring with the token, for the CaRotation that takes the nodes
    there. Stored before any node is touched, so a kill never loses the new key."""
    retiring = yaml.safe_load(olds.get("retiringYaml") or "") or {}
    now = news.get("rotate") or {}
    for kind in _started(olds, news):
        old = bundle.os if kind == "talos" else bundle.k8s
        if kind == "talos":
            new = pki.new_ca(organizations=["talos"], key_type="ed25519", days=secrets.CA_VALIDITY_DAYS)
            bundle = dataclasses.replace(bundle, os=new)
        else:
            new = pki.new_ca(organizations=["kubernetes"], key_type="ecdsa", days=secrets.CA_VALIDITY_DAYS)
            bundle = dataclasses.replace(bundle, k8s=new)
        retiring[kind] = {"token": now[kind], "crt": old.crt.decode(), "key": old.key.decode()}
    return bundle, (yaml.safe_dump(retiring, sort_keys=True) if retiring else "")


def _renew_before(props: dict) -> float:
    value = props.get("renewBeforeDays")
    return float(value) if isinstance(value, (int, float)) else renewal.RENEW_BEFORE_DAYS


def _renewal_due(olds: dict, news: dict) -> bool:
    """The held client certificate expires within renewBeforeDays (reads the clock, nothing else)."""
    old = olds.get("talosconfig")
    if not isinstance(old, str) or not known(news.get("renewBeforeDays")):
        return False
    try:
        return renewal.due(renewal.talosconfig_cert(old), _renew_before(news))
    except (ConfigError, ValueError):
        return False  # nothing readable to renew; create and update always write a valid one


def _outputs(props: dict, secrets_yaml: str, bundle: secrets.SecretsBundle, client: CertKey, retiring: str) -> dict:
    return {
        "clusterName": props["clusterName"],
        "endpoints": list(props["endpoints"]),
        "rotate": props.get("rotate") or {},
        "retiringYaml": retiring,
        "renewBeforeDays": props.get("renewBeforeDays"),
        "secretsYaml": secrets_yaml,
        "talosconfig": _render(props, bundle, client),
        "talosconfigExpires": renewal.rfc3339(renewal.expiry(client.crt)),
        "kubernetesCa": bundle.k8s.crt.decode(),  # public: what a Kubeconfig diff compares, known at preview
    }


class TalosSecrets(TypedResource, module="talos", name="TalosSecrets"):
    """Outputs: secretsYaml (talosctl format) and talosconfig (context = cluster_name, endpoints =
    endpoints, os:admin certificate renewed within renewBeforeDays of expiry), both secret;
    talosconfigExpires (RFC 3339 UTC, not secret); kubernetesCa (the bundle's Kubernetes CA
    certificate, public)."""

    secretsYaml: pulumi.Output[str]
    talosconfig: pulumi.Output[str]
    talosconfigExpires: pulumi.Output[str]
    retiringYaml: pulumi.Output[str]
    kubernetesCa: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        cluster_name: pulumi.Input[str],
        endpoints: pulumi.Input[list],
        import_yaml: pulumi.Input[str] | None = None,
        renew_before_days: pulumi.Input[float] = renewal.RENEW_BEFORE_DAYS,
        rotate: dict | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "rotate": dict(rotate or {}),
            "retiringYaml": None,
            "clusterName": cluster_name,
            "endpoints": endpoints,
            "importYaml": pulumi.Output.secret(import_yaml) if import_yaml is not None else None,
            "renewBeforeDays": renew_before_days,
            "secretsYaml": None,
            "talosconfig": None,
            "talosconfigExpires": None,
            "kubernetesCa": None,
        }
        super().__init__(TalosSecretsProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_OUTPUTS))
