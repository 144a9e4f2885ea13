"""Sections of bench/RESULTS.md: one per benchmark, markdown, also printed to stdout.

A run of a subset (`python -m bench --only noop`) replaces only those sections and keeps the
others from the previous RESULTS.md; each section carries its own date and load average, so
a kept section stays attributable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bench import common

BEGIN = "<!-- bench:{} -->"
END = "<!-- /bench:{} -->"


@dataclass
class Section:
    name: str
    title: str
    aim: str = ""
    rows: list[tuple[str, str]] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    started: str = field(default_factory=common.now)
    load_start: str = field(default_factory=common.loadavg)
    load_end: str = ""
    runs: int = 0

    def row(self, what: str, value: str) -> None:
        self.rows.append((what, value))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        self.tables.append("\n".join(lines))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def not_measured(self, reason: str) -> None:
        self.missing.append(reason)

    def verdict(self, met: bool, text: str) -> None:
        self.verdicts.append(f"{'**met**' if met else '**missed**'}: {text}")

    def markdown(self) -> str:
        out = [BEGIN.format(self.name), f"## {self.name}: {self.title}", ""]
        out.append(f"Measured {self.started}; load average at start {self.load_start}"
                   + (f", at end {self.load_end}" if self.load_end else "")
                   + (f"; runs per figure: {self.runs}" if self.runs else "") + ".")
        out.append("")
        if self.aim:
            out += [f"Aim: {self.aim}.", ""]
        for reason in self.missing:
            body = reason.strip()
            if "\n" in body:
                first, rest = body.split("\n", 1)
                out += [f"**not measured**: {first}", "", "```", rest, "```", ""]
            else:
                out += [f"**not measured**: {body}", ""]
        if self.rows:
            out += ["| figure | value |", "|---|---|"]
            out += [f"| {w} | {v} |" for w, v in self.rows]
            out.append("")
        for t in self.tables:
            out += [t, ""]
        for v in self.verdicts:
            out += [f"- {v}"]
        if self.verdicts:
            out.append("")
        for n in self.notes:
            out += [n, ""]
        out.append(END.format(self.name))
        return "\n".join(out)


def header(machine: dict, versions: dict, runs: int, started: str) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`venv/bin/python -m bench`, see bench/__main__.py); figures, not tests. "
        "Medians over N runs with min and max beside them. Each section says when it was measured and the "
        "load average then: this is a shared 2-core machine, and a busy one reads slower.",
        "",
        f"Last written {started}, runs per figure N={runs}.",
        "",
        "## Machine",
        "",
        "| fact | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in machine.items()]
    lines += ["", "## Versions", "", "| pin | version |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in versions.items()]
    lines.append("")
    return "\n".join(lines)


def kept_sections(previous: str) -> dict[str, str]:
    out = {}
    for m in re.finditer(r"<!-- bench:([\w-]+) -->.*?<!-- /bench:\1 -->", previous, re.S):
        out[m.group(1)] = m.group(0)
    return out
