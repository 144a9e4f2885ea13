"""The engine's event log (`pulumi --event-log FILE`), followed while a run writes it."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

EVENT_POLL = 0.02  # seconds between reads of a growing event log


@dataclass
class Event:
    t: float  # wall clock when we read it (time.time()), EVENT_POLL resolution
    engine_ts: int  # the engine's own stamp: whole seconds
    kind: str
    data: dict


class EventTail:
    """Follows `pulumi --event-log FILE` while the engine writes it (one JSON object per
    line, written unbuffered) and stamps each event when it appears: the engine's own
    timestamps have whole-second resolution."""

    def __init__(self, path: Path):
        self.path = path
        self.events: list[Event] = []
        self._buf = b""
        self._pos = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-tail", daemon=True)

    def start(self) -> "EventTail":
        self._thread.start()
        return self

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                chunk = f.read()
        except FileNotFoundError:
            return
        if not chunk:
            return
        t = time.time()
        self._pos += len(chunk)
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            kind = next((k for k in doc if k.endswith("Event")), "?")
            self.events.append(Event(t, int(doc.get("timestamp") or 0), kind, doc.get(kind) or {}))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._read()
            self._stop.wait(EVENT_POLL)

    def stop(self) -> list[Event]:
        self._stop.set()
        self._thread.join(5)
        self._read()
        return self.events
