"""Run emulated Talos nodes as a process:

    python -m lab.talos_node --address 127.0.0.11 [--address 127.0.0.12 ...]
        [--reboot-delay 1] [--talos-version v1.13.0] [--control-port 50080] [--ttl 3600]

Each node serves the Talos API on <address>:50000 (maintenance mode at start) and a control
endpoint on <address>:<control-port> (see control.py). Stops on SIGINT/SIGTERM or after --ttl
seconds, so a forgotten emulator does not outlive its purpose.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from lab.talos_node import control
from lab.talos_node.lab import Lab
from lab.talos_node.node import DEFAULT_TALOS_VERSION, check_loopback


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.talos_node", description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", action="append", required=True, help="loopback address of a node (repeatable)")
    parser.add_argument("--reboot-delay", type=float, default=1.0, help="seconds a reboot keeps a node down")
    parser.add_argument("--talos-version", default=DEFAULT_TALOS_VERSION)
    parser.add_argument("--control-port", type=int, default=control.CONTROL_PORT)
    parser.add_argument("--ttl", type=float, default=0, help="stop after this many seconds (0: run until signalled)")
    args = parser.parse_args(argv)
    try:
        addresses = [check_loopback(a) for a in args.address]
    except ValueError as exc:
        parser.error(str(exc))

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with Lab(reboot_delay=args.reboot_delay, talos_version=args.talos_version) as lab:
        controls = []
        try:
            for address in addresses:
                node = lab.add_node(address)
                controls.append(control.serve(node, args.control_port))
                print(f"talos node {address}:50000 (maintenance), control http://{address}:{args.control_port}/", flush=True)
            stop.wait(args.ttl or None)
        finally:
            for server in controls:
                server.shutdown()
                server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
