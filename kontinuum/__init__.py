"""Kontinuum core library: Talos, hub and Kubernetes logic with no Pulumi imports."""
