"""Talos node emulator: real gRPC over TLS with Ed25519 certificates, as a Talos machine serves
it, for the lab and the tests. See lab.py for the Python API and __main__.py for the process.
"""

from lab.talos_node.cluster import ClusterRegistry, HealthProbe, HealthQuery
from lab.talos_node.faults import Faults
from lab.talos_node.lab import Lab
from lab.talos_node.machineconfig import cluster_key_of
from lab.talos_node.node import DEFAULT_TALOS_VERSION, EmulatedNode

__all__ = [
    "ClusterRegistry",
    "DEFAULT_TALOS_VERSION",
    "EmulatedNode",
    "Faults",
    "HealthProbe",
    "HealthQuery",
    "Lab",
    "cluster_key_of",
]
