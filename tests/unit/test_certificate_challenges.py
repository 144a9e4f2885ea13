"""The Certificate wait's timeout message carries cert-manager's own reason from the pending
ACME Challenges of the Certificate's names (pure part of kontinuum.kube.certificates)."""

from kontinuum.kube.certificates import describe_challenges, timeout_message

CERT = {"metadata": {"namespace": "kontinuum-system", "name": "zone", "generation": 1},
        "spec": {"dnsNames": ["a.lab.kontinuum.test"], "issuerRef": {"kind": "ClusterIssuer", "name": "lab-a"}}}
SELF_CHECK = ("Waiting for HTTP-01 challenge propagation: failed to perform self check GET request "
              "'http://a.lab.kontinuum.test/.well-known/acme-challenge/tok': dial tcp: lookup a.lab.kontinuum.test "
              "on 127.0.46.202:8053: no such host")


def challenge(name: str, host: str, **status) -> dict:
    return {"metadata": {"name": name}, "spec": {"dnsName": host, "type": "HTTP-01"}, "status": status}


def test_only_the_certificates_names_are_described_with_state_and_reason():
    said = describe_challenges(CERT, [
        challenge("zone-1-2", "a.lab.kontinuum.test", state="pending", reason=SELF_CHECK),
        challenge("other-1-2", "b.lab.kontinuum.test", state="invalid", reason="unrelated"),
    ])
    assert said == f"Challenge zone-1-2 (HTTP-01 for a.lab.kontinuum.test): pending: {SELF_CHECK}"
    assert describe_challenges(CERT, [challenge("x", "a.lab.kontinuum.test")]) == (
        "Challenge x (HTTP-01 for a.lab.kontinuum.test): pending: no reason given yet")
    assert describe_challenges(CERT, []) is None


def test_timeout_message_puts_cert_managers_reason_before_the_checklist():
    msg = timeout_message("kontinuum-system", "zone", 60, "last conditions: Ready=False (DoesNotExist)", CERT,
                          "Ready=True (ACMEAccountRegistered)", "kontinuum-system/zone",
                          describe_challenges(CERT, [challenge("zone-1-2", "a.lab.kontinuum.test", reason=SELF_CHECK)]))
    assert msg.startswith("Certificate kontinuum-system/zone not Ready after 60 s: last conditions: ")
    assert f"cert-manager says: Challenge zone-1-2 (HTTP-01 for a.lab.kontinuum.test): pending: {SELF_CHECK}. " in msg
    assert msg.index("cert-manager says") < msg.index("Check the ClusterIssuer lab-a")
    assert "cert-manager says" not in timeout_message("ns", "n", 1, "x", CERT, None, None)
