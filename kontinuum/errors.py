"""Shared error base classes, so callers can catch Kontinuum failures as one family."""

from __future__ import annotations


class KontinuumError(Exception):
    """Base of every error Kontinuum raises on purpose."""


class ConfigError(KontinuumError, ValueError):
    """Bad user input, reported with the exact path so the operator can find it.

    Subclasses ValueError too: it is a bad value, and generic callers that only
    know ValueError still catch it.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)
