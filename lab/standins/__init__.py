"""Lab stand-ins for what cannot run without real pods: each is a small poll loop in a thread
that plays one missing component against real apiservers, and says in its logs, objects and
docstrings that it is a stand-in.

- cert_issuer: marks cert-manager Certificates Ready (and writes their TLS Secret) once their
  issuer and the Gateway that serves them exist.
- gateway: Cilium's Gateway API operator, LB-IPAM, L2 announcer and Envoy's HTTP listeners:
  gives Gateways the addresses the cluster's Cilium configuration would (none without an
  exposure setting), serves HTTP there and answers cert-manager's HTTP-01 challenges.
- kontinuum_server: heartbeats a zone's Kontinuum into the hub once the zone Deployment is
  Available, authenticating with the identity key delivered to the zone.
"""
