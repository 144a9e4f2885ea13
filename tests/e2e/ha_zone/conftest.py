"""The lab and the HA zone this package's modules share (tests/e2e/cluster_lab.py): started for
the package and stopped after its last test, not left running for the rest of the session."""

import pytest

from tests.e2e.cluster_lab import cluster_lab, ha, ready  # noqa: F401 - pytest finds fixtures by name here


@pytest.fixture(scope="module")
def zone_stack(cluster_lab, ha):  # noqa: F811
    """The HA zone's stack and the lab, once test_talos_cluster_engine brought the zone up."""
    stack, _, _ = ha
    if not ready(stack, "ha"):
        pytest.skip("the HA zone did not come up (test_talos_cluster_engine)")
    return stack, cluster_lab
