"""Which pods count as healthy, and how a stuck one is described."""

from kubernetes.client import (V1ContainerState, V1ContainerStateWaiting, V1ContainerStatus, V1ObjectMeta, V1Pod,
                               V1PodCondition, V1PodStatus)

from kubernetes.client import V1OwnerReference

from kontinuum.kube.pods import problem, replaced


def pod(phase, conditions=(), statuses=(), reason=None):
    return V1Pod(metadata=V1ObjectMeta(name="p"),
                 status=V1PodStatus(phase=phase, conditions=list(conditions), container_statuses=list(statuses),
                                    reason=reason))


def cond(kind, status, message=None, reason=None):
    return V1PodCondition(type=kind, status=status, message=message, reason=reason)


def test_running_and_ready_or_succeeded_is_healthy():
    assert problem(pod("Running", [cond("Ready", "True")])) is None
    assert problem(pod("Succeeded")) is None


def test_running_not_ready_names_waiting_containers():
    waiting = V1ContainerStatus(name="agent", image="i", image_id="", ready=False, restart_count=3,
                                state=V1ContainerState(waiting=V1ContainerStateWaiting(reason="CrashLoopBackOff")))
    p = problem(pod("Running", [cond("Ready", "False")], [waiting]))
    assert str(p) == "p Running: agent: CrashLoopBackOff"


def test_unschedulable_pending_carries_the_scheduler_message():
    msg = "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."
    p = problem(pod("Pending", [cond("PodScheduled", "False", message=msg, reason="Unschedulable")]))
    assert "didn't have free ports" in str(p) and p.phase == "Pending"


def test_failed_pod_is_a_problem():
    assert problem(pod("Failed", reason="Evicted")).reason == "Evicted"


def test_a_pod_a_node_shutdown_ended_is_replaced_by_its_controller_not_stuck():
    ended = pod("Failed", [cond("DisruptionTarget", "True", reason="TerminationByKubelet")], reason="Terminated")
    ended.metadata.owner_references = [V1OwnerReference(api_version="apps/v1", kind="ReplicaSet", name="op",
                                                        uid="u", controller=True)]
    assert replaced(ended)
    ended.metadata.owner_references[0].kind = "Job"  # a Job counts its failures: still a problem
    assert not replaced(ended)
    assert not replaced(pod("Failed", reason="Error"))  # nothing replaces a bare pod


def test_a_pod_the_kubelet_rejected_at_admission_is_replaced_by_its_controller_not_stuck():
    """A pod bound to a node whose kubelet is shutting down ends Failed, NodeShutdown, without a
    DisruptionTarget (Kubernetes v1.35 kubelet rejectPod); its ReplicaSet starts another."""
    rejected = pod("Failed", reason="NodeShutdown")
    rejected.metadata.owner_references = [V1OwnerReference(api_version="apps/v1", kind="ReplicaSet", name="op",
                                                           uid="u", controller=True)]
    assert replaced(rejected)
    rejected.metadata.owner_references[0].controller = False  # only the controlling owner replaces it
    assert not replaced(rejected)
