"""The lab's ACME server: Pebble (Let's Encrypt's ACME test server) and pebble-challtestsrv as
the DNS server of the lab's zone host names, on loopback addresses the lab owns.

- Pebble serves its ACME directory over TLS with a certificate for its own address, signed by a
  CA the lab makes once per state directory and keeps (`<workdir>/ca.crt`, what a stack passes as
  `hub.acme.caBundle`, or names in `hub.acme.caBundleFile`); it validates HTTP-01
  on port 80 of the address the DNS server gives for the host, as a public ACME server does, and
  issues from its own (per-start) root and intermediate.
- pebble-challtestsrv answers A queries only for the records set through its management API
  (`set_a`): no default address, so a host nobody published does not resolve. The lab sets each
  zone's record once the zone's Gateway has an address (what an operator does with the record a
  `dns: manual` zone exports); cert-manager's HTTP-01 self check and Pebble both resolve there.

Everything binds the given addresses only; stop() ends exactly the two processes.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kontinuum.talos import pki
from lab.process import Managed, wait_until

ACME_PORT = 14000
MANAGEMENT_PORT = 15000
DNS_PORT = 8053
DNS_MANAGEMENT_PORT = 8055
START_TIMEOUT = 30.0  # seconds for both to answer
CALL_TIMEOUT = 5.0  # seconds per management call


@dataclass
class Acme:
    workdir: Path
    address: str  # Pebble's ACME and management listeners
    dns_address: str  # pebble-challtestsrv's DNS (UDP+TCP) and management listeners
    http_port: int = 80  # where Pebble's validation dials for HTTP-01

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.pebble: Managed | None = None
        self.dns: Managed | None = None
        self.ca: pki.CertKey | None = None

    @property
    def directory(self) -> str:
        return f"https://{self.address}:{ACME_PORT}/dir"

    @property
    def nameserver(self) -> str:
        return f"{self.dns_address}:{DNS_PORT}"

    @property
    def ca_bundle(self) -> str:
        assert self.ca is not None, "start() first"
        return self.ca.crt.decode()

    def start(self) -> "Acme":
        self.ca = ensure_ca(self.workdir)
        leaf = pki.issue_cert(self.ca, common_name=self.address, ip_addresses=[self.address],
                              dns_names=["localhost"], server=True, key_type="ecdsa")
        crt, key = self.workdir / "pebble.crt", self.workdir / "pebble.key"
        crt.write_bytes(leaf.crt)
        key.write_bytes(pki.to_standard_pem(leaf.key))
        key.chmod(0o600)
        config = {"pebble": {
            "listenAddress": f"{self.address}:{ACME_PORT}",
            "managementListenAddress": f"{self.address}:{MANAGEMENT_PORT}",
            "certificate": str(crt), "privateKey": str(key),
            "httpPort": self.http_port, "tlsPort": 443,
            "ocspResponderURL": "", "externalAccountBindingRequired": False,
            "retryAfter": {"authz": 1, "order": 1},
        }}
        cfg = self.workdir / "pebble-config.json"
        cfg.write_text(json.dumps(config, indent=2))
        dns = f"{self.dns_address}:{DNS_PORT}"
        self.dns = Managed("pebble-challtestsrv", [
            "pebble-challtestsrv", f"-dnsserver={dns}", f"-management={self.dns_address}:{DNS_MANAGEMENT_PORT}",
            "-http01=", "-https01=", "-tlsalpn01=", "-doh=", "-defaultIPv4=", "-defaultIPv6=",
        ], self.workdir / "logs" / "pebble-challtestsrv.log").start()
        # No random validation delay, no injected bad nonces: the lab's waits stay short and
        # deterministic; everything else is Pebble's default behaviour.
        env = {"PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0", "PATH": _path()}
        self.pebble = Managed("pebble", ["pebble", f"-config={cfg}", f"-dnsserver={dns}"],
                              self.workdir / "logs" / "pebble.log", env=env).start()
        wait_until("Pebble and its DNS server answering", self._answering, START_TIMEOUT, interval=0.2)
        return self

    def _answering(self) -> bool:
        for p in (self.pebble, self.dns):
            if p is None or not p.running():
                raise RuntimeError(f"{p.name if p else 'pebble'} exited:\n{p.tail() if p else ''}")
        ctx = ssl.create_default_context(cadata=self.ca_bundle)
        with urllib.request.urlopen(self.directory, context=ctx, timeout=CALL_TIMEOUT) as r:
            json.loads(r.read())
        self._manage("set-default-ipv4", {"ip": ""})
        return True

    def _manage(self, path: str, body: dict) -> None:
        req = urllib.request.Request(f"http://{self.dns_address}:{DNS_MANAGEMENT_PORT}/{path}",
                                     data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=CALL_TIMEOUT) as r:
            r.read()

    def set_a(self, host: str, addresses: list[str]) -> None:
        """Publish host → addresses (replacing what was there)."""
        fqdn = host.rstrip(".") + "."
        self._manage("clear-a", {"host": fqdn})
        self._manage("add-a", {"host": fqdn, "addresses": list(addresses)})

    def clear_a(self, host: str) -> None:
        self._manage("clear-a", {"host": host.rstrip(".") + "."})

    def intermediates(self) -> list[str]:
        """PEM of the intermediate(s) Pebble issues from (management API)."""
        ctx = ssl.create_default_context(cadata=self.ca_bundle)
        with urllib.request.urlopen(f"https://{self.address}:{MANAGEMENT_PORT}/intermediates/0", context=ctx,
                                    timeout=CALL_TIMEOUT) as r:
            return [r.read().decode()]

    def processes(self) -> list[Managed]:
        return [p for p in (self.pebble, self.dns) if p is not None]

    def stop(self) -> None:
        for p in (self.pebble, self.dns):
            if p is not None:
                p.stop()
        self.pebble = self.dns = None

    def __enter__(self) -> "Acme":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def ensure_ca(workdir: Path) -> pki.CertKey:
    """The lab ACME server's CA in `workdir` (ca.crt, ca.key), made on first use and kept.

    Test workers call this at the same time: a lock makes one of them create the pair, and each
    file appears whole (written aside, then renamed), so no reader sees half a PEM or a key that
    belongs to another certificate."""
    import fcntl

    workdir = Path(workdir)
    crt, key = workdir / "ca.crt", workdir / "ca.key"
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / ".ca.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if crt.exists() and key.exists():
            return pki.CertKey(crt.read_bytes(), key.read_bytes())
        ca = pki.new_ca(common_name="kontinuum lab ACME server CA", organizations=["kontinuum-lab"])
        for path, data, mode in ((key, ca.key, 0o600), (crt, ca.crt, 0o644)):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(b"")
            tmp.chmod(mode)
            tmp.write_bytes(data)
            tmp.replace(path)
        return ca


def _path() -> str:
    import os

    return os.environ.get("PATH", "")
