"""ZoneIdentity: the zone's ed25519 identity, issued once at create and never rotated.

No I/O at all: create only generates a key and a self-signed certificate. diff never reports
a change, so no later config edit (and no provider upgrade) can re-issue the key behind the
hub's back; the only way to a new identity is to remove the zone (or `pulumi up --replace`
this resource on purpose), after which the hub certificate Secret is rewritten with it.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ResourceProvider

from kontinuum import zone_identity
from providers.common import TypedResource, with_secret_outputs

SECRET_OUTPUTS = ("privateKeyPem",)


class ZoneIdentityProvider(ResourceProvider):
    """Stateless and credential-free; the key exists only in the (secret) outputs."""

    def check(self, _olds, news):
        failures = [CheckFailure(k, "required") for k in ("region", "zone") if not news.get(k)]
        return CheckResult(news, failures)

    def diff(self, _id, _olds, _news):
        return DiffResult(changes=False, replaces=[], stables=["privateKeyPem", "certificatePem", "thumbprint"])

    def create(self, props):
        ident = zone_identity.issue(props["region"], props["zone"])
        cn = zone_identity.common_name(props["region"], props["zone"])
        return CreateResult(id_=cn, outs={
            "region": props["region"],
            "zone": props["zone"],
            "commonName": cn,
            "privateKeyPem": ident.private_key_pem,
            "certificatePem": ident.certificate_pem,
            "thumbprint": ident.thumbprint,
        })


class ZoneIdentity(TypedResource, module="hub", name="ZoneIdentity"):
    """Outputs: privateKeyPem (secret), certificatePem, thumbprint (SHA-256 of the cert DER, hex), commonName."""

    privateKeyPem: pulumi.Output[str]
    certificatePem: pulumi.Output[str]
    thumbprint: pulumi.Output[str]
    commonName: pulumi.Output[str]

    def __init__(self, resource_name: str, *, region: str, zone: str, opts: pulumi.ResourceOptions | None = None):
        props = {"region": region, "zone": zone, "commonName": None, "privateKeyPem": None,
                 "certificatePem": None, "thumbprint": None}
        super().__init__(ZoneIdentityProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_OUTPUTS))

    # snake_case aliases for component code
    @property
    def private_key_pem(self) -> pulumi.Output[str]:
        return self.privateKeyPem

    @property
    def certificate_pem(self) -> pulumi.Output[str]:
        return self.certificatePem
