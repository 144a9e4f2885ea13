"""Benchmarks (issue 9): see bench/__main__.py."""
