"""Helm's release records left behind by a killed run, and clearing them without touching
the release's objects.

Helm keeps one Secret per revision (`sh.helm.release.v1.<name>.v<revision>`, labels owner=helm,
name, status, version). A run killed inside `helm install` leaves revision 1 in pending-install
(or deployed, when only the engine's bookkeeping was lost); the next install then refuses with
"cannot re-use a name that is still in use", and an upgrade killed midway leaves a pending-upgrade
revision that makes every later upgrade fail with "another operation is in progress".

Deleting those records, and only those, is what makes the next install or upgrade run again:
the objects stay where they are (the cluster may already use them), and Helm 3.2+ adopts objects
that carry its release annotations (which Helm set on every object before creating it).
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client

from kontinuum.kube.clients import api_client, describe_error, server_of

PENDING = ("pending-install", "pending-upgrade", "pending-rollback")
# What a killed create can leave: revision 1 in any of these (deployed: only Pulumi's record was lost).
LEFT_BY_A_CREATE = ("pending-install", "deployed", "failed")


@dataclass(frozen=True)
class Record:
    name: str  # the Secret's name
    revision: int
    status: str


class HelmRecordError(RuntimeError):
    """The records could not be read or cleared; the message says which release and why."""


def records_to_clear(records: list[Record], operation: str) -> tuple[list[Record], str | None]:
    """The records to delete after a killed `operation` ('creating', 'updating', ...), and why
    nothing may be deleted when the history is not one a killed run of ours can explain."""
    if not records:
        return [], None
    if operation == "creating":
        if all(r.revision == 1 and r.status in LEFT_BY_A_CREATE for r in records):
            return sorted(records, key=lambda r: r.name), None
        history = ", ".join(f"v{r.revision} {r.status}" for r in sorted(records, key=lambda r: r.revision))
        return [], f"its history ({history}) is older than the interrupted install; it is not ours to clear"
    latest = max(records, key=lambda r: r.revision)
    return ([latest] if latest.status in PENDING else []), None


def parse(items) -> list[Record]:
    out = []
    for s in items:
        labels = s.metadata.labels or {}
        try:
            revision = int(labels.get("version", ""))
        except ValueError:
            continue
        out.append(Record(s.metadata.name, revision, labels.get("status", "")))
    return out


def clear(kubeconfig: str, namespace: str, release: str, operation: str, *, timeout: float) -> list[Record]:
    """Delete the records a killed `operation` left for `release`; returns what was deleted.
    Raises HelmRecordError when the cluster does not answer or the history is not ours."""
    where = f"Helm release {namespace}/{release} on {server_of(kubeconfig)}"
    api = api_client(kubeconfig)
    core = client.CoreV1Api(api)
    try:
        listed = core.list_namespaced_secret(namespace, label_selector=f"owner=helm,name={release}",
                                             _request_timeout=timeout)
        chosen, refusal = records_to_clear(parse(listed.items), operation)
        if refusal:
            raise HelmRecordError(f"{where}: {refusal}; resolve it with `helm history` / `helm uninstall`, "
                                  "then re-run")
        for r in chosen:
            try:
                core.delete_namespaced_secret(r.name, namespace, _request_timeout=timeout)
            except client.ApiException as e:
                if e.status != 404:
                    raise
        return chosen
    except client.ApiException as e:
        if e.status == 404:
            return []  # no namespace: the install never reached the cluster
        raise HelmRecordError(f"{where}: {describe_error(e)}") from None
    except HelmRecordError:
        raise
    except Exception as e:  # noqa: BLE001 - every transport failure names the cluster
        raise HelmRecordError(f"{where}: did not answer within {timeout:g} s ({describe_error(e)})") from None
    finally:
        api.close()
