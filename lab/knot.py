"""A real Knot DNS `knotd` serving one primary zone on a loopback address, for RFC 2136 tests.

The zone takes dynamic updates signed with the given TSIG key (ACL action `update`). Knot binds
the exact address it is given, so each test owns its own 127.x address (BIND's named only
listens on addresses configured on an interface). `knotd` comes from the Debian package knot
(tools/debian-packages.sh installs it) and runs in the foreground with the test's thread as
parent (PDEATHSIG).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dns.exception
import dns.message
import dns.query
import dns.rcode

from lab.process import Managed, wait_until

START_TIMEOUT = 30.0


def knotd_binary() -> str | None:
    return shutil.which("knotd") or ("/usr/sbin/knotd" if Path("/usr/sbin/knotd").exists() else None)


class KnotServer:
    def __init__(self, workdir: Path, *, address: str, port: int, zone: str, key_name: str, key_secret: str,
                 algorithm: str = "hmac-sha256"):
        if not address.startswith("127."):
            raise ValueError(f"DNS test server {address}: the lab only binds 127.0.0.0/8")
        self.workdir, self.address, self.port, self.zone = Path(workdir), address, port, zone.rstrip(".")
        self.key_name, self.key_secret, self.algorithm = key_name, key_secret, algorithm
        self.process: Managed | None = None

    def _write(self) -> Path:
        (self.workdir / "db").mkdir(parents=True, exist_ok=True)
        (self.workdir / f"{self.zone}.zone").write_text(
            f"$TTL 60\n@ IN SOA ns.{self.zone}. hostmaster.{self.zone}. 1 60 60 600 60\n"
            f"@ IN NS ns.{self.zone}.\nns IN A {self.address}\n")
        conf = self.workdir / "knot.conf"
        conf.write_text(f"""server:
    rundir: "{self.workdir}"
    listen: {self.address}@{self.port}
database:
    storage: "{self.workdir}/db"
log:
  - target: stderr
    any: info
key:
  - id: {self.key_name}
    algorithm: {self.algorithm}
    secret: {self.key_secret}
acl:
  - id: updater
    key: {self.key_name}
    action: update
template:
  - id: default
    storage: "{self.workdir}"
    file: "%s.zone"
zone:
  - domain: {self.zone}
    acl: updater
""")
        return conf

    def start(self) -> "KnotServer":
        knotd = knotd_binary()
        if knotd is None:
            raise RuntimeError("Knot DNS `knotd` is not installed: run tools/debian-packages.sh (apt-get install knot)")
        conf = self._write()
        self.process = Managed("knotd", [knotd, "-c", str(conf)], self.workdir / "knotd.log").start()
        try:
            wait_until(f"knotd answering SOA {self.zone} on {self.address}:{self.port}", self._answers,
                       START_TIMEOUT, interval=0.2)
        except TimeoutError:
            tail = self.process.tail()
            self.stop()
            raise RuntimeError(f"knotd did not start:\n{tail}") from None
        return self

    def _answers(self) -> bool:
        if self.process is None or not self.process.running():
            raise RuntimeError(f"knotd exited: {self.process.tail() if self.process else ''}")
        try:
            return self._query(self.zone + ".", "SOA").rcode() == dns.rcode.NOERROR
        except (OSError, EOFError, dns.exception.DNSException):
            return False

    def _query(self, name: str, rtype: str):
        return dns.query.tcp(dns.message.make_query(name, rtype), self.address, port=self.port, timeout=2.0)

    def lookup(self, name: str, rtype: str = "A") -> list[str]:
        """What the server answers (unsigned query over TCP)."""
        return sorted(str(rd) for rrset in self._query(name, rtype).answer for rd in rrset)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
