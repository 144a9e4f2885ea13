"""A Git server over SSH on loopback, as a Git host serves a repository to a deploy key: OpenSSH's
sshd (Debian's openssh-server, tools/debian-packages.sh) in the foreground with its own config,
host key and authorized_keys, serving the bare repos under `root` (lab/git_server.init_repo).

`ssh://<user>@<address>:<port>/<name>.git`, where <user> is the account the lab runs as (sshd
logs in only existing accounts; running as root it allows root only with a forced command).
Each deploy key added is read-only and restricted: its forced command runs git-upload-pack on a
repository directly under `root` and refuses anything else (no shell, no push, no forwarding).
The server binds only 127.0.0.0/8 and stops with stop() or its owner (PDEATHSIG via Managed).
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from lab.process import Managed

KEYGEN_TIMEOUT = 30.0
START_TIMEOUT = 10.0  # seconds for sshd to listen

# The forced command of every deploy key: `git-upload-pack '<name>.git'` (or '/<name>.git', as
# go-git sends it) on a repository directly under the root, nothing else.
UPLOAD_ONLY = r"""#!/bin/sh
root=$1
case "$SSH_ORIGINAL_COMMAND" in
  "git-upload-pack '"*"'") ;;
  *) echo "lab git: this deploy key is read-only (git-upload-pack only)" >&2; exit 1 ;;
esac
name=${SSH_ORIGINAL_COMMAND#"git-upload-pack '"}; name=${name%"'"}; name=${name#/}
case "$name" in
  */*|.*|"") echo "lab git: no repository '$name'" >&2; exit 1 ;;
esac
[ -d "$root/$name" ] || { echo "lab git: no repository '$name'" >&2; exit 1; }
exec git-upload-pack --strict "$root/$name"
"""


def sshd_binary() -> str:
    for candidate in (shutil.which("sshd"), "/usr/sbin/sshd", "/sbin/sshd"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate  # sshd re-executes itself: it needs its absolute path
    raise RuntimeError("sshd not found: install Debian's openssh-server (tools/debian-packages.sh, `make debs`)")


def keypair(path: Path, comment: str) -> tuple[str, str]:
    """A new ed25519 key at `path` (OpenSSH format); (private key text, public key line)."""
    path.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True,
                   capture_output=True, timeout=KEYGEN_TIMEOUT)
    return path.read_text(), path.with_suffix(".pub").read_text().strip()


class GitSshServer:
    """sshd serving `root`'s bare repositories to the deploy keys added with deploy_key()."""

    def __init__(self, root: Path, address: str, port: int = 0, *, workdir: Path | None = None):
        if not ipaddress.ip_address(address).is_loopback:
            raise ValueError(f"git ssh server address {address}: the lab only binds 127.0.0.0/8")
        self.root, self.address = Path(root).resolve(), address
        self.port = port or _free_port(address)
        self.dir = Path(workdir or self.root.parent / f".sshd-{address}-{self.port}")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.user = getpass.getuser()
        self.process: Managed | None = None
        _, self.host_public = keypair(self.dir / "host_ed25519", "lab-git-host")
        (self.dir / "authorized_keys").write_text("")
        wrapper = self.dir / "upload-only"
        wrapper.write_text(UPLOAD_ONLY)
        wrapper.chmod(0o755)

    def url(self, name: str) -> str:
        return f"ssh://{self.user}@{self.address}:{self.port}/{name}.git"

    def known_hosts(self) -> str:
        """The server's host key as `ssh-keyscan` prints it (Flux's known_hosts)."""
        kind, key = self.host_public.split()[:2]
        return f"[{self.address}]:{self.port} {kind} {key}\n"

    def deploy_key(self, name: str) -> str:
        """A new read-only deploy key for every repository; returns its private key (OpenSSH PEM)."""
        private, public = keypair(self.dir / f"deploy-{name}", f"lab-deploy-{name}")
        line = f'restrict,command="{self.dir / "upload-only"} {self.root}" {public}\n'
        with open(self.dir / "authorized_keys", "a") as f:
            f.write(line)
        return private

    def config(self) -> str:
        return "\n".join([
            f"ListenAddress {self.address}:{self.port}",
            f"HostKey {self.dir / 'host_ed25519'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            f"PidFile {self.dir / 'sshd.pid'}",
            f"AllowUsers {self.user}",
            "PermitRootLogin forced-commands-only",  # root (the lab's user in CI) only through the forced command
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM no", "StrictModes no",  # the key files live in the test's scratch directory
            "AllowTcpForwarding no", "X11Forwarding no", "PermitTunnel no", "AllowAgentForwarding no",
            "PrintMotd no", "LogLevel VERBOSE", "",
        ])

    def start(self) -> "GitSshServer":
        (self.dir / "sshd_config").write_text(self.config())
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        argv = [sshd_binary(), "-D", "-e", "-f", str(self.dir / "sshd_config")]
        self.process = Managed("sshd", argv, self.dir / "sshd.log").start()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if not self.process.running():
                raise RuntimeError(f"sshd exited at start:\n{self.process.tail()}")
            try:
                socket.create_connection((self.address, self.port), timeout=1.0).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"sshd did not listen on {self.address}:{self.port} within {START_TIMEOUT:g} s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]
