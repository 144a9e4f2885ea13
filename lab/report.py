"""Print each zone's URL, addresses and readiness from a stack's outputs (the end of `make lab`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from lab.pulumi_cli import WRAPPER


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stack", default="lab")
    args = parser.parse_args()
    out = subprocess.run([str(WRAPPER), "--non-interactive", "stack", "output", "--stack", args.stack, "--json"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        return out.returncode
    zones = json.loads(out.stdout or "{}").get("zones", {})
    if not zones:
        print(f"stack {args.stack}: no zones")
        return 1
    width = max(len(z) for z in zones)
    for name, z in sorted(zones.items()):
        state = "ready" if z.get("ready") else "NOT ready"
        addresses = ",".join(z.get("addresses") or []) or "no address"
        print(f"zone {name:<{width}}  {state:<9}  {z.get('url')} → {addresses}  "
              f"identity sha256:{z.get('identityThumbprint', '')[:16]}…")
    return 0 if all(z.get("ready") for z in zones.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
