"""Wake a bounded wait loop as soon as the objects it observes change.

Every wait in Kontinuum is a loop: observe (list or get), decide, pause. A fixed pause costs up
to its length per phase, and phases chain. A Kubernetes watch says when something changed, so
the pause becomes "until the next event on the watched objects, at most `interval`". The loop
keeps its observation, its bound and its messages: the watch only decides when to look again.
A watch that breaks is re-opened in the background (each re-open starts with the objects'
current state, i.e. a re-list), and a missed event costs at most one interval, never a hang.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes import client, watch

from kontinuum.kube.clients import api_client

WATCH_SECONDS = 30  # the server ends each watch after this; it is re-opened at once
REOPEN_PAUSE = 1.0  # at least this long between opening watches of one source
REOPEN_MAX = 8.0  # a source refused again and again is tried this seldom (doubling from REOPEN_PAUSE)
COALESCE = 0.05  # after a wake, so a burst of events costs one observation
CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class Source:
    """What to watch: a list call of the kubernetes client (by API class and method name) and
    its arguments, e.g. Source(client.CoreV1Api, "list_namespaced_pod", ("kube-system",),
    {"label_selector": "k8s-app=cilium"})."""

    api: type
    method: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def pods(namespace: str, selector: str = "", field_selector: str = "") -> Source:
    kwargs = {k: v for k, v in (("label_selector", selector), ("field_selector", field_selector)) if v}
    return Source(client.CoreV1Api, "list_namespaced_pod", (namespace,), kwargs)


def all_pods(field_selector: str = "") -> Source:
    return Source(client.CoreV1Api, "list_pod_for_all_namespaces", (),
                  {"field_selector": field_selector} if field_selector else {})


def custom_objects(group: str, version: str, plural: str, namespace: str | None = None, name: str = "") -> Source:
    kwargs = {"field_selector": f"metadata.name={name}"} if name else {}
    if namespace is None:
        return Source(client.CustomObjectsApi, "list_cluster_custom_object", (group, version, plural), kwargs)
    return Source(client.CustomObjectsApi, "list_namespaced_custom_object", (group, version, namespace, plural), kwargs)


def deployments(namespace: str, name: str = "") -> Source:
    kwargs = {"field_selector": f"metadata.name={name}"} if name else {}
    return Source(client.AppsV1Api, "list_namespaced_deployment", (namespace,), kwargs)


def reopen_pause(refused: int) -> float:
    """Seconds from opening a watch to opening the next, after `refused` refusals in a row."""
    return min(REOPEN_PAUSE * 2 ** max(refused - 1, 0), REOPEN_MAX)


class Waker:
    """Background watches on (kubeconfig, Source) pairs; `pause(seconds)` returns early when
    any of them saw an event since the last pause. Use as a context manager around the loop.

    A kubeconfig that cannot be read, or a watch the server refuses, leaves the loop exactly as
    it was before watches existed: pausing the full interval."""

    def __init__(self, *watched: tuple[str, Source], watch_seconds: int = WATCH_SECONDS):
        self._watched = [w for w in watched if w[0]]
        self._watch_seconds = watch_seconds
        self._changed = threading.Event()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._streams: list[watch.Watch] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Waker:
        for kubeconfig, source in self._watched:
            t = threading.Thread(target=self._run, args=(kubeconfig, source), daemon=True,
                                 name=f"watch-{source.method}")
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()
        with self._lock:
            for w in self._streams:
                w.stop()

    def wake(self) -> None:
        """End the current (or next) pause at once."""
        self._changed.set()

    def pause(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when woken by a change. Bounded like the sleep it replaces."""
        woke = self._changed.wait(max(0.0, seconds))
        if woke:
            self._stopped.wait(min(COALESCE, seconds))
        self._changed.clear()
        return woke

    def _watch_once(self, list_call: Callable, source: Source) -> bool:
        """One watch until the server ends it; False when it was refused or broke before any event."""
        stream = watch.Watch()
        with self._lock:
            self._streams.append(stream)
        events = 0
        try:
            for _event in stream.stream(list_call, *source.args, timeout_seconds=self._watch_seconds,
                                        _request_timeout=(CONNECT_TIMEOUT, self._watch_seconds + 5), **source.kwargs):
                events += 1
                self._changed.set()
                if self._stopped.is_set():
                    break
        except Exception:  # noqa: BLE001 - broken or refused: re-opened by the caller
            return events > 0
        finally:
            with self._lock:
                self._streams.remove(stream)
        return True

    def _run(self, kubeconfig: str, source: Source) -> None:
        try:
            api = api_client(kubeconfig)
        except Exception:  # noqa: BLE001 - no watch: the loop pauses its full interval
            return
        try:
            list_call: Callable = getattr(source.api(api), source.method)
            refused = 0  # watches refused in a row
            while not self._stopped.is_set():
                opened = time.monotonic()
                refused = 0 if self._watch_once(list_call, source) else refused + 1
                # A watch the server ends at once (refused, broken) is not re-opened in a tight
                # loop, and one refused each time (a dead apiserver, a CRD not installed yet) less
                # and less often: the loop's own interval covers what it would have seen.
                self._stopped.wait(max(0.0, reopen_pause(refused) - (time.monotonic() - opened)))
        finally:
            api.close()
