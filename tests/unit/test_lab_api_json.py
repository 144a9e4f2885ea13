"""The lab's reading of the API's JSON: a pass lists pods once and each reader picks its own by
label selector, as the API would have for a list with that selector."""

from __future__ import annotations

import pytest

from lab import api_json


def pod(**labels) -> dict:
    return {"metadata": {"name": "p", "labels": labels}}


def test_a_selector_matches_as_the_api_would():
    assert api_json.matches(pod(app="source-controller"), "app=source-controller")
    assert not api_json.matches(pod(app="kustomize-controller"), "app=source-controller")
    both = "app.kubernetes.io/component=webhook,app.kubernetes.io/name=webhook"
    assert api_json.matches(pod(**{"app.kubernetes.io/component": "webhook", "app.kubernetes.io/name": "webhook"}), both)
    assert not api_json.matches(pod(**{"app.kubernetes.io/component": "webhook"}), both)
    assert not api_json.matches({"metadata": {"name": "unlabelled"}}, "app=x")
    assert api_json.matches(pod(), "")


@pytest.mark.parametrize("selector", ["app!=x", "app==x", "app", "app in (x)"])
def test_a_selector_it_cannot_read_is_refused_not_guessed(selector):
    with pytest.raises(ValueError, match="only k=v"):
        api_json.matches(pod(app="x"), selector)
