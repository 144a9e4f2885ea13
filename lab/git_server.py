"""A Git server on loopback for Flux sync tests: git's own smart-HTTP backend
(`git http-backend`, from Debian's git package) behind a small threaded HTTP server.

Repositories are bare repos under `root`; `http://<address>:<port>/<name>.git`. With `token`
set, every request needs HTTP basic auth with that password (Flux's `username` + `password`
Secret), else 401, as a Git host refuses a private repository. The server stops with stop()
or when its owner exits (daemon threads), and binds only 127.0.0.0/8.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

CGI_TIMEOUT = 30.0  # seconds per git http-backend run


def init_repo(root: Path, name: str, files: dict[str, str], *, branch: str = "main") -> str:
    """A bare repo `<root>/<name>.git` with one commit of `files`; returns the commit SHA."""
    bare = root / f"{name}.git"
    work = root / f".{name}-work"
    env = dict(os.environ, GIT_AUTHOR_NAME="lab", GIT_AUTHOR_EMAIL="lab@kontinuum.test", GIT_COMMITTER_NAME="lab",
               GIT_COMMITTER_EMAIL="lab@kontinuum.test", GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")

    def git(*args, cwd=work):
        return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True,
                              timeout=CGI_TIMEOUT).stdout.strip()

    if not bare.exists():
        subprocess.run(["git", "init", "-q", "--bare", "-b", branch, str(bare)], env=env, check=True, timeout=CGI_TIMEOUT)
        git("config", "http.receivepack", "false", cwd=bare)
        work.mkdir(parents=True, exist_ok=True)
        git("init", "-q", "-b", branch)
        git("remote", "add", "origin", str(bare))
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    git("add", "-A")
    git("commit", "-q", "--allow-empty", "-m", "lab commit")
    git("push", "-q", "origin", f"HEAD:refs/heads/{branch}")
    return git("rev-parse", "HEAD")


class _Handler(BaseHTTPRequestHandler):
    server: "GitServer"

    def log_message(self, *_args) -> None:  # quiet: tests read results, not access logs
        pass

    def _authorized(self) -> bool:
        token = self.server.token
        if token is None:
            return True
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            _user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return False
        return password == token

    def _serve(self) -> None:
        if not self._authorized():
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="lab git"')
            self.end_headers()
            return
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {"GIT_PROJECT_ROOT": str(self.server.root), "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": parts.path,
               "QUERY_STRING": parts.query, "REQUEST_METHOD": self.command, "REMOTE_USER": "lab",
               "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
               "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": os.environ.get("PATH", "")}
        if self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=CGI_TIMEOUT)
        head, _, payload = out.stdout.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.decode(errors="replace").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = _serve
    do_POST = _serve


class GitServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, address: str, port: int = 0, *, token: str | None = None):
        if not ipaddress.ip_address(address).is_loopback:
            raise ValueError(f"git server address {address}: the lab only binds 127.0.0.0/8")
        self.root, self.token = Path(root), token
        super().__init__((address, port), _Handler)
        self._thread: threading.Thread | None = None

    def url(self, name: str) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/{name}.git"

    def start(self) -> "GitServer":
        self._thread = threading.Thread(target=self.serve_forever, name="lab-git-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
