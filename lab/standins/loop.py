"""The bounded poll loop every stand-in runs in its own thread, and its kube client factory.

A supervisor runs many stand-ins at once, so none may block: each poll makes only API calls
with a request timeout, a failed poll is recorded and retried on the next tick, and stop()
returns within one tick plus the longest call.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import urllib3
from kubernetes import client

from kontinuum.kube import clients, watching

REQUEST_TIMEOUT = 10.0  # seconds, every API call a stand-in makes
# A stand-in's watches run this long before the server ends them; each re-open re-lists (and
# wakes the loop once), so it is long: the fallback interval covers a missed event anyway.
WATCH_SECONDS = 300
STOP_GRACE = REQUEST_TIMEOUT * 3  # join bound: one poll is a handful of calls at most

STANDIN_ANNOTATION = "lab.kontinuum.sh/stand-in"


def api_client(kubeconfig: str | Path) -> client.ApiClient:
    """A client for a kubeconfig given as text or as a Path to a file. (The lab's own admin
    kubeconfig of a zone skips server verification on loopback, lab/controlplane.py: no warning
    per request for that.)"""
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    text = kubeconfig.read_text() if isinstance(kubeconfig, Path) else kubeconfig
    return clients.api_client(text)


def list_json(list_call, *args, **kwargs) -> list[dict]:
    """The items of a list call as the API's JSON: for loops that read many objects often and
    need a few fields, where the client's model objects would cost most of the CPU."""
    response = list_call(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
    return json.loads(response.data).get("items") or []


def describe(e: BaseException) -> str:
    """One line for an error; an ApiException's own str() spans headers and body."""
    if isinstance(e, client.ApiException):
        try:
            detail = json.loads(e.body or "{}").get("message") or e.reason
        except (ValueError, AttributeError):
            detail = e.reason
        return f"API error {e.status}: {detail}"
    return f"{type(e).__name__}: {e}"


class PollingStandin:
    """start() runs poll() now and then every `interval` seconds until stop(); and at once
    (after a 50 ms coalescing pause) whenever something it watches changes (`watched()`), so a
    stand-in that watches what it reads can poll seldom and still react as fast as a controller."""

    name = "stand-in"

    def __init__(self, interval: float):
        self.interval = interval
        self.log = logging.getLogger(f"lab.standins.{self.name}")
        self.last_error: str | None = None
        self.polls = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._waker = watching.Waker()

    def poll(self) -> None:
        raise NotImplementedError

    def watched(self) -> list[tuple[str, watching.Source]]:
        """(kubeconfig text, list call) pairs whose changes wake the loop; none: plain polling."""
        return []

    def next_pause(self) -> float:
        """Seconds until the next poll unless something watched changes first."""
        return self.interval

    def close(self) -> None:
        """Release clients after the loop ended; subclasses override."""

    def start(self) -> "PollingStandin":
        if self._thread is not None:
            raise RuntimeError(f"{self.name} (lab stand-in) already started")
        self._thread = threading.Thread(target=self._run, name=f"standin-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._waker.wake()
        if self._thread is not None:
            self._thread.join(STOP_GRACE)
            if self._thread.is_alive():
                self.log.warning("(lab stand-in) %s: poll still running after %.0f s; left as daemon", self.name, STOP_GRACE)
        self.close()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def poll_once(self) -> None:
        """One poll with errors recorded, not raised: the loop body, callable directly by tests."""
        try:
            self.poll()
            self.last_error = None
        except Exception as e:  # noqa: BLE001 - a failed poll is retried on the next tick
            message = describe(e)
            if message != self.last_error:
                self.log.warning("(lab stand-in) %s: poll failed, retrying: %s", self.name, message)
            self.last_error = message
        finally:
            self.polls += 1

    def _run(self) -> None:
        self.log.info("(lab stand-in) %s started", self.name)
        self._waker = watching.Waker(*self.watched(), watch_seconds=WATCH_SECONDS)
        with self._waker:
            while not self._stop.is_set():
                self.poll_once()
                self._waker.pause(0 if self._stop.is_set() else self.next_pause())
        self.log.info("(lab stand-in) %s stopped", self.name)


class RevisionGate:
    """Says whether a loop that reads only the cluster's objects needs another pass: every write
    to a cluster moves its etcd revision, which a one-item list returns (the lab's apiservers
    read from etcd, no watch cache). `moved()` is True when the revision changed since the last
    True, after `stale` seconds whatever it says (for what the revision cannot see: a process
    that died, a failed pass), or when the probe itself fails."""

    def __init__(self, stale: float = 5.0, clock=None):
        self.stale = stale
        self._clock = clock or time.monotonic
        self._seen: str | None = None
        self._passed = float("-inf")

    def moved(self, api: client.ApiClient) -> bool:
        try:
            revision = client.CoreV1Api(api).list_namespace(limit=1, _request_timeout=REQUEST_TIMEOUT).metadata.resource_version
        except Exception:  # noqa: BLE001 - no answer: let the pass find out and report
            revision = None
        now = self._clock()
        if revision is not None and revision == self._seen and now - self._passed < self.stale:
            return False
        self._seen, self._passed = revision, now
        return True

