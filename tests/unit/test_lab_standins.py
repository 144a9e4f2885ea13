"""Pure decisions of the lab stand-ins: identity matching and when a Certificate may be issued."""

from __future__ import annotations

import datetime as dt

from kontinuum.talos import pki
from lab.standins import cert_issuer as ci
from lab.standins.kontinuum_server import identity_problem, key_matches_certificate

AT = {"key_at": "kontinuum-system/kontinuum-identity", "cert_at": "eu-eu-1a-identity"}


def _identity() -> pki.CertKey:
    return pki.new_ca(common_name="eu-eu-1a", key_type="ed25519")


def test_matching_identity_is_accepted_in_talos_and_standard_pem():
    ident = _identity()
    assert key_matches_certificate(ident.key, ident.crt)
    assert identity_problem(ident.key, ident.crt, **AT) is None
    assert identity_problem(pki.to_standard_pem(ident.key), ident.crt, **AT) is None


def test_wrong_key_is_rejected_naming_both_secrets():
    ident, other = _identity(), _identity()
    assert not key_matches_certificate(other.key, ident.crt)
    assert identity_problem(other.key, ident.crt, **AT) == (
        "identity key in kontinuum-system/kontinuum-identity does not match the hub's certificate eu-eu-1a-identity"
    )


def test_missing_or_garbage_material_is_named():
    ident = _identity()
    assert "no identity key" in identity_problem(None, ident.crt, **AT)
    assert "holds no certificate" in identity_problem(ident.key, b"", **AT)
    assert "not a readable PEM private key" in identity_problem(b"junk", ident.crt, **AT)
    assert "not a readable PEM certificate" in identity_problem(ident.key, b"junk", **AT)


def _cert(issuer_kind="ClusterIssuer", issuer="letsencrypt", secret="eu-1a-tls", ns="kontinuum-system") -> dict:
    return {
        "metadata": {"name": "kontinuum", "namespace": ns, "generation": 1},
        "spec": {"secretName": secret, "issuerRef": {"kind": issuer_kind, "name": issuer}, "dnsNames": ["a.b"]},
    }


def _gateway(secret="eu-1a-tls", ns="kontinuum-system", ref_ns=None, protocol="HTTPS") -> dict:
    ref = {"kind": "Secret", "group": "", "name": secret}
    if ref_ns:
        ref["namespace"] = ref_ns
    return {
        "metadata": {"name": "kontinuum", "namespace": ns},
        "spec": {"listeners": [
            {"name": "http", "protocol": "HTTP", "port": 80},
            {"name": "https", "protocol": protocol, "port": 443, "tls": {"mode": "Terminate", "certificateRefs": [ref]}},
        ]},
    }


def test_gateway_must_terminate_tls_with_the_certificates_secret():
    assert ci.gateway_serves_secret(_gateway(), "kontinuum-system", "eu-1a-tls")
    assert not ci.gateway_serves_secret(_gateway(secret="other"), "kontinuum-system", "eu-1a-tls")
    assert not ci.gateway_serves_secret(_gateway(protocol="HTTP"), "kontinuum-system", "eu-1a-tls")
    assert not ci.gateway_serves_secret(_gateway(ns="elsewhere"), "kontinuum-system", "eu-1a-tls")
    assert ci.gateway_serves_secret(_gateway(ns="elsewhere", ref_ns="kontinuum-system"), "kontinuum-system", "eu-1a-tls")


def test_blocker_names_every_missing_prerequisite():
    cert = _cert()
    both = ci.blocker(cert, set(), set(), [])
    assert "ClusterIssuer 'letsencrypt'" in both and "Secret kontinuum-system/eu-1a-tls" in both
    assert "Gateway" not in ci.blocker(cert, set(), set(), [_gateway()])
    assert "ClusterIssuer" not in ci.blocker(cert, {"letsencrypt"}, set(), [])
    assert ci.blocker(cert, {"letsencrypt"}, set(), [_gateway()]) is None
    ns_issuer = _cert(issuer_kind="Issuer")
    assert ci.blocker(ns_issuer, {"letsencrypt"}, set(), [_gateway()]) == "waiting for Issuer kontinuum-system/letsencrypt"
    assert ci.blocker(ns_issuer, set(), {("kontinuum-system", "letsencrypt")}, [_gateway()]) is None


def test_issuer_kind_defaults_to_issuer_like_cert_manager():
    assert ci.issuer_ref({"spec": {"issuerRef": {"name": "x"}}}) == ("Issuer", "x")


def test_parse_duration():
    assert ci.parse_duration(None) == dt.timedelta(days=90)
    assert ci.parse_duration("2160h") == dt.timedelta(days=90)
    assert ci.parse_duration("1h30m") == dt.timedelta(minutes=90)
    assert ci.parse_duration("bogus") == dt.timedelta(days=90)
