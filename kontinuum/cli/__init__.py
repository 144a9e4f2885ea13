"""Subcommands of `python -m kontinuum`, one module each."""
