"""`python -m kontinuum <command>`: the operator CLI (DESIGN §2). Each command lives in its
own module under kontinuum/cli/ with `add_arguments(parser)` and `run(args) -> exit code`."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "check": ("kontinuum.cli.check", "validate stacks/Pulumi.<stack>.yaml offline (no engine), exit 0/1"),
    "schema": ("kontinuum.cli.schema", "print the stack config contract as JSON Schema or as the README table"),
    "migrate": ("kontinuum.cli.migrate", "move a stack made by an earlier Kontinuum to the current layout (state only)"),
    "preview": ("kontinuum.cli.preview", "preview every region stack (bounded, parallel): Markdown/JSON summary, "
                "exit 0 no changes / 2 changes / 3 invalid / 4 failed"),
    "rollout": ("kontinuum.cli.rollout", "pulumi up region by region in waves, each gated on the one before staying "
                "healthy; resumes where it stopped (exit 0 done / 3 invalid / 4 failed; --preview as preview)"),
    "recover": ("kontinuum.cli.recover", "settle what a killed up or destroy left (tools/pulumi runs it first)"),
    "backup": ("kontinuum.cli.backup", "take an encrypted etcd snapshot of a zone (Talos EtcdSnapshot)"),
    "backup-kit": ("kontinuum.cli.backup_kit", "write what a backup job needs of a stack's zones (its os:etcd:backup "
                   "credential and backup key, nothing else) to a 0600 file: `backup --kit` then needs no state"),
    "restore": ("kontinuum.cli.restore", "bring a zone's etcd back from a backup (Talos disaster recovery)"),
    "status": ("kontinuum.cli.status", "how every zone is doing (read-only, bounded): exit 0 fine / 1 warning / "
               "2 unhealthy / 3 unreachable"),
    "talosconfig": ("kontinuum.cli.talosconfig", "issue a short-lived talosconfig for a person (role, TTL), 0600"),
    "kubeconfig": ("kontinuum.cli.kubeconfig", "issue a short-lived kubeconfig for a person (group, TTL), 0600"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Only the named command's module is imported (tools/pulumi runs `recover` before every up).
    wanted = argv[0] if argv and argv[0] in COMMANDS else None
    parser = argparse.ArgumentParser(prog="python -m kontinuum")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if wanted in (None, name):
            modules[name] = importlib.import_module(module)
            modules[name].add_arguments(command)
    args = parser.parse_args(argv)
    return modules[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
