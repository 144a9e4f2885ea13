"""TalosSecrets: a cluster's secrets bundle and admin talosconfig; the bundle is issued once.

create generates a bundle (or imports an operator's `talosctl gen secrets` file) and issues
the os:admin client certificate of the talosconfig. An update (cluster name or endpoints
changed) renders the talosconfig again around the SAME certificate, read back from the
previous talosconfig, unless that certificate expires within `renewBeforeDays`: then the diff
reports a change on its own and the update issues a new one from the bundle's OS CA
(kontinuum/talos/renewal.py), before anything downstream uses it. check rejects a changed
import on an existing resource; diff never replaces. No I/O anywhere: nothing here talks to a
node.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CreateResult, ResourceProvider, UpdateResult

from kontinuum.errors import ConfigError
from kontinuum.talos import renewal, secrets, talosconfig
from kontinuum.talos.pki import CertKey
from providers.common import TypedResource, diff_inputs, with_secret_outputs
from providers.talos_common import Inputs, known

UPDATE_ON = ("clusterName", "endpoints")
SECRET_OUTPUTS = ("secretsYaml", "talosconfig", "importYaml")


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
        if not d.changes and _renewal_due(olds, news):
            d.changes = True
        return d

    def create(self, props):
        bundle = secrets.load(props["importYaml"]) if props.get("importYaml") else secrets.generate()
        client = talosconfig.issue_client_cert(bundle.os)
        return CreateResult(id_=props["clusterName"], outs=_outputs(props, secrets.dump(bundle), bundle, client))

    def update(self, _id, olds, news):
        bundle = secrets.load(olds["secretsYaml"], check_rsa=False)  # our own state
        previous = talosconfig.parse(olds["talosconfig"])
        client = CertKey(previous.crt, previous.key)
        if renewal.due(previous.crt, _renew_before(news)):
            client = renewal.renew_talosconfig_cert(bundle.os)
        return UpdateResult(outs=_outputs(news, olds["secretsYaml"], bundle, client))


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


def _outputs(props: dict, secrets_yaml: str, bundle: secrets.SecretsBundle, client: CertKey) -> dict:
    return {
        "clusterName": props["clusterName"],
        "endpoints": list(props["endpoints"]),
        "renewBeforeDays": props.get("renewBeforeDays"),
        "secretsYaml": secrets_yaml,
        "talosconfig": _render(props, bundle, client),
        "talosconfigExpires": renewal.rfc3339(renewal.expiry(client.crt)),
    }


class TalosSecrets(TypedResource, module="talos", name="TalosSecrets"):
    """Outputs: secretsYaml (talosctl format) and talosconfig (context = cluster_name, endpoints =
    endpoints, os:admin certificate renewed within renewBeforeDays of expiry), both secret;
    talosconfigExpires (RFC 3339 UTC, not secret)."""

    secretsYaml: pulumi.Output[str]
    talosconfig: pulumi.Output[str]
    talosconfigExpires: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        cluster_name: pulumi.Input[str],
        endpoints: pulumi.Input[list],
        import_yaml: pulumi.Input[str] | None = None,
        renew_before_days: pulumi.Input[float] = renewal.RENEW_BEFORE_DAYS,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "clusterName": cluster_name,
            "endpoints": endpoints,
            "importYaml": pulumi.Output.secret(import_yaml) if import_yaml is not None else None,
            "renewBeforeDays": renew_before_days,
            "secretsYaml": None,
            "talosconfig": None,
            "talosconfigExpires": None,
        }
        super().__init__(TalosSecretsProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_OUTPUTS))
