"""Session fixtures of the TalosCluster e2e modules: one lab and one HA zone for both."""

from tests.e2e.cluster_lab import cluster_lab, ha  # noqa: F401 - pytest finds fixtures by name here
