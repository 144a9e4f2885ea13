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


class ConfigErrors(ConfigError):
    """Several ConfigErrors at once, so the operator fixes every bad path in one round."""

    def __init__(self, errors: list[ConfigError]) -> None:
        if not errors:
            raise ValueError("ConfigErrors needs at least one error")
        self.errors = list(errors)
        super().__init__(errors[0].path, errors[0].problem)
        self.args = ("\n".join(str(e) for e in self.errors),)

    def __str__(self) -> str:
        return self.args[0]
