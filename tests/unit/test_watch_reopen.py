"""A watch the server refuses again and again (a dead apiserver, a CRD not installed yet) is
re-opened less and less often, down to one try every REOPEN_MAX; one it answers resets that.
The suite's zones module spent most of its lab's CPU re-opening refused watches every second."""

from __future__ import annotations

import time

from kontinuum.kube import watching
from kontinuum.talos import pki
from lab.controlplane import kubeconfig_text


def test_the_pause_doubles_with_each_refusal_in_a_row_up_to_its_cap():
    assert [watching.reopen_pause(n) for n in range(7)] == [1.0, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_refusals_in_a_row_are_counted_and_an_answered_watch_resets_them(monkeypatch):
    answers = iter([False, False, False, True, False, True])
    refused: list[int] = []

    def watch_once(self, list_call, source) -> bool:
        return next(answers, True)

    def pause(n: int) -> float:
        refused.append(n)
        return 0.0

    monkeypatch.setattr(watching.Waker, "_watch_once", watch_once)
    monkeypatch.setattr(watching, "reopen_pause", pause)
    ca = pki.new_ca(common_name="kubernetes")
    kubeconfig = kubeconfig_text("c", "https://127.0.0.1:1", ca.crt,
                                 pki.issue_cert(ca, common_name="admin", client=True, key_type="ecdsa"))
    with watching.Waker((kubeconfig, watching.pods("x"))):
        deadline = time.monotonic() + 10
        while len(refused) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert refused[:6] == [1, 2, 3, 0, 1, 0]
