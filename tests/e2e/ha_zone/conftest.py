"""The lab and the HA zone this package's two modules share (tests/e2e/cluster_lab.py): started
for the package and stopped after its last test, not left running for the rest of the session."""

from tests.e2e.cluster_lab import cluster_lab, ha  # noqa: F401 - pytest finds fixtures by name here
