"""`python -m kontinuum status`'s judgement (kontinuum/fleet_status.py): each observation becomes
the level an alerting job acts on, and says what is wrong and where."""

from __future__ import annotations

import datetime as dt

from kontinuum.fleet_status import FINE, UNHEALTHY, UNREACHABLE, WARNING, Observation, judge, markdown

NOW = dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc)
FAR = NOW + dt.timedelta(days=300)


def fine(**over) -> Observation:
    o = Observation("eu-a", configured_talos="v1.13.0", configured_kubernetes="v1.35.4",
                    talos={"10.0.0.1": "v1.13.0", "10.0.0.2": "v1.13.0"},
                    nodes={"cp": (True, "v1.35.4"), "w": (True, "v1.35.4")},
                    expiries={"the Talos API CA": FAR, "the admin kubeconfig": FAR},
                    backup_at=NOW - dt.timedelta(hours=3), backup_path="/b/eu-a-1.etcd.sealed")
    for k, v in over.items():
        setattr(o, k, v)
    return o


def level(o: Observation) -> tuple[int, list[str]]:
    z = judge(o, now=NOW, renew_before=dt.timedelta(days=30), backup_max_age=dt.timedelta(hours=26))
    return z.level, [f.text for f in z.findings]


def test_a_zone_as_configured_with_a_fresh_backup_is_fine():
    assert level(fine()) == (FINE, [])


def test_a_version_other_than_configured_or_a_credential_near_expiry_is_a_warning():
    got, said = level(fine(talos={"10.0.0.1": "v1.13.0", "10.0.0.2": "v1.12.9"}))
    assert got == WARNING and said == ["10.0.0.2 runs Talos v1.12.9, the config says v1.13.0"]
    got, said = level(fine(expiries={"the admin kubeconfig": NOW + dt.timedelta(days=10)}))
    assert got == WARNING and "the admin kubeconfig expires on 2026-12-12" in said[0]


def test_no_or_an_old_backup_is_a_warning():
    assert level(fine(backup_at=None, backup_path=None)) == (WARNING, ["no backup of this zone was found"])
    got, said = level(fine(backup_at=NOW - dt.timedelta(days=4)))
    assert got == WARNING and "4 d old" in said[0]


def test_a_node_down_not_ready_etcd_or_an_expired_credential_is_unhealthy():
    assert level(fine(talos={"10.0.0.1": "v1.13.0", "10.0.0.2": None}))[0] == UNHEALTHY
    assert level(fine(nodes={"w": (False, "v1.35.4")})) == (UNHEALTHY, ["Node w is not Ready"])
    assert level(fine(etcd_problem="etcd member cp-2 is not healthy"))[0] == UNHEALTHY
    assert level(fine(expiries={"the Kubernetes CA": NOW - dt.timedelta(hours=1)}))[0] == UNHEALTHY


def test_a_zone_where_no_node_answers_is_unreachable():
    got, said = level(fine(talos={"10.0.0.1": None, "10.0.0.2": None}, api_problem="connection refused"))
    assert got == UNREACHABLE and said[0].startswith("no node answers the Talos API")


def test_the_markdown_has_a_row_per_zone_and_a_line_per_finding():
    zones = [judge(o, now=NOW, renew_before=dt.timedelta(days=30), backup_max_age=dt.timedelta(hours=26))
             for o in (fine(), fine(cluster="eu-b", nodes={"w": (False, "v1.35.4")}))]
    text = markdown("eu", "eu", zones, now=NOW)
    assert text.startswith("### Region `eu` (stack `eu`): unhealthy")
    assert "| `eu-a` | fine | v1.13.0 | v1.35.4 | 2/2 |" in text and "| `eu-b` | unhealthy |" in text
    assert "- `eu-b` unhealthy: Node w is not Ready" in text


def test_the_renewal_window_is_the_zones_own_as_its_state_recorded():
    from kontinuum.status_probe import renew_before_days

    def res(name, props):
        return {"custom": True, "urn": f"urn:pulumi:eu::kontinuum::kontinuum:talos:TalosSecrets::{name}",
                "type": "kontinuum:talos:TalosSecrets", "outputs": props}

    deployment = {"resources": [res("eu-a-secrets", {"renewBeforeDays": 45}), res("eu-b-secrets", {})]}
    assert renew_before_days(deployment, "eu-a") == 45.0
    assert renew_before_days(deployment, "eu-b") is None and renew_before_days(deployment, "eu-c") is None
