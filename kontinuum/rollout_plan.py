"""The waves of `python -m kontinuum rollout` and where a re-run resumes (pure but for reading
files): the fleet file or `--waves a,b/c`, the progress file, and each region's fingerprint.

A region is done when its `pulumi up` succeeded; its wave is healthy once every zone of the
wave was ready and stayed healthy for the soak. A re-run skips a done region only while its
fingerprint (its stack file, the local files its config names, and the program `pulumi up` runs)
is what it was when it was done: an edited stack file, chart or CA file, or another Kontinuum
version rolls it out again. A wave whose regions are
all skipped and were healthy is not probed again; any other wave is gated again.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
# What `pulumi up` runs: a change here is a new release, rolled out to every region again.
PROGRAM = ("__main__.py", "Pulumi.yaml", "requirements.txt", "tools/versions.env", "kontinuum_components",
           "providers", "kontinuum")
NOT_PROGRAM = ("kontinuum/cli",)  # operator commands (this one too): not part of what an up does
DEFAULTS = {"parallel": 2, "soak": 300.0}
FLEET_KEYS = {"waves", "parallel", "soak", "timeout", "readyTimeout", "stacksDir", "state", "logs"}
WAVE_KEYS = {"name", "stacks", "soak"}
APPLIED, HEALTHY, FAILED = "applied", "healthy", "failed"


class FleetError(ValueError):
    """The fleet file or --waves is wrong: nothing was started."""


@dataclass
class Wave:
    name: str
    stacks: list[str]
    soak: float | None = None  # None: the fleet's


@dataclass
class Fleet:
    waves: list[Wave]
    settings: dict = field(default_factory=dict)  # parallel, soak, timeout, readyTimeout, stacksDir, state, logs
    path: Path | None = None


def parse_waves(text: str) -> list[Wave]:
    """`--waves dev/staging-eu,staging-us/eu,us`: waves split by '/', stacks by ','."""
    waves = []
    for i, part in enumerate(text.split("/"), 1):
        stacks = [s.strip() for s in part.split(",") if s.strip()]
        if not stacks:
            raise FleetError(f"--waves {text!r}: wave {i} names no stack (waves are separated by '/', "
                             "stacks within a wave by ',')")
        waves.append(Wave(f"wave {i}", stacks))
    return check(waves, "--waves")


def load_fleet(path: Path) -> Fleet:
    """A fleet file: `waves:` in order (each `[stack, …]` or `{name, stacks, soak}`), and optional
    `parallel`, `soak`, `timeout`, `readyTimeout` (seconds), `stacksDir`, `state`, `logs` (paths
    relative to the file)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise FleetError(f"{path}: cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise FleetError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("waves"), list) or not doc["waves"]:
        raise FleetError(f"{path}: needs `waves:`, a list of waves in order (each a list of stacks)")
    unknown = sorted(set(doc) - FLEET_KEYS)
    if unknown:
        raise FleetError(f"{path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(FLEET_KEYS))})")
    waves = [_wave(path, i, w) for i, w in enumerate(doc["waves"], 1)]
    settings = {k: doc[k] for k in FLEET_KEYS - {"waves"} if doc.get(k) is not None}
    for key in ("parallel", "soak", "timeout", "readyTimeout"):
        if key in settings and (isinstance(settings[key], bool) or not isinstance(settings[key], (int, float))
                                or settings[key] < (1 if key == "parallel" else 0)):
            raise FleetError(f"{path}: {key}: {settings[key]!r} is not a number ≥ {1 if key == 'parallel' else 0}")
    for key in ("stacksDir", "state", "logs"):
        if key in settings:
            settings[key] = (path.parent / str(settings[key])).resolve()
    return Fleet(check(waves, str(path)), settings, path)


def _wave(path: Path, i: int, w) -> Wave:
    where = f"{path}: waves[{i - 1}]"
    if isinstance(w, list):
        w = {"stacks": w}
    if not isinstance(w, dict) or set(w) - WAVE_KEYS:
        raise FleetError(f"{where}: a wave is a list of stacks or a mapping with {', '.join(sorted(WAVE_KEYS))}")
    stacks = w.get("stacks")
    if not isinstance(stacks, list) or not stacks or not all(isinstance(s, str) and s for s in stacks):
        raise FleetError(f"{where}.stacks: a non-empty list of stack names")
    soak = w.get("soak")
    if soak is not None and (isinstance(soak, bool) or not isinstance(soak, (int, float)) or soak < 0):
        raise FleetError(f"{where}.soak: {soak!r} is not a number of seconds ≥ 0")
    return Wave(str(w.get("name") or f"wave {i}"), list(stacks), None if soak is None else float(soak))


def check(waves: list[Wave], where: str) -> list[Wave]:
    seen: dict[str, str] = {}
    for w in waves:
        for s in w.stacks:
            if s in seen:
                raise FleetError(f"{where}: stack {s!r} is in {seen[s]} and in {w.name}; a region is rolled out once")
            seen[s] = w.name
    return waves


# --- fingerprints ------------------------------------------------------------------------------


def _files_under(path: Path) -> list[Path]:
    """A file, or a folder's files, sorted; nothing when there is none."""
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.is_file() else []


def _feed(h, files: list[Path], base: Path) -> None:
    for p in files:
        h.update(p.relative_to(base).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")


def program_digest(root: Path = ROOT) -> str:
    """One digest of every file of the program `pulumi up` runs (sorted paths and contents)."""
    h = hashlib.sha256()
    for top in PROGRAM:
        _feed(h, [p for p in _files_under(root / top) if "__pycache__" not in p.parts
                  and not p.relative_to(root).as_posix().startswith(NOT_PROGRAM)], root)
    return h.hexdigest()


# Config keys whose string value names a local file or folder `pulumi up` reads: (parent key, key).
FILE_KEYS = {(None, "caBundleFile"), (None, "hubKubeconfigFile"), ("chart", "path"), ("gatewayApi", "source")}


def referenced_files(stack_text: str) -> list[str]:
    """The local files and folders a stack's config points to (a local chart's `path`,
    `hubKubeconfigFile`, `hub.acme.caBundleFile`, a Gateway API CRD `source` that is no URL):
    editing one changes what `pulumi up` does as surely as editing the stack file."""
    found: list[str] = []

    def walk(node, parent: str | None) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, parent)
            return
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            name = str(key).split(":", 1)[-1]  # top-level keys carry the `kontinuum:` namespace
            if isinstance(value, str) and ((None, name) in FILE_KEYS or (parent, name) in FILE_KEYS):
                if not value.startswith(("http://", "https://")):
                    found.append(value)
            else:
                walk(value, name)

    doc = yaml.safe_load(stack_text) or {}
    walk(doc.get("config") if isinstance(doc, dict) else None, None)
    return sorted(set(found))


def file_digest(path: Path) -> str:
    """SHA-256 of a file, or of a folder's files (sorted relative paths and contents); "absent"
    when there is none (the up will say so, the fingerprint only has to differ)."""
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    if not path.is_dir():
        return "absent"
    h = hashlib.sha256()
    _feed(h, _files_under(path), path)
    return h.hexdigest()


def fingerprint(stack_file: Path, program: str, root: Path = ROOT) -> dict:
    """What a done region's up depended on. Relative paths are read from the project folder,
    where `pulumi up` runs the program."""
    data = stack_file.read_bytes()
    fp = {"stackFile": hashlib.sha256(data).hexdigest(), "program": program}
    files = {name: file_digest(root / name) for name in referenced_files(data.decode())}
    if files:  # absent for a stack that names none: progress recorded before stays valid
        fp["files"] = files
    return fp


# --- progress ----------------------------------------------------------------------------------


def load_state(path: Path) -> dict:
    """The progress file, or a fresh one. A file we cannot read is an error, not a fresh start:
    starting over would roll out regions again that an operator believes done."""
    if not path.exists():
        return {"version": 1, "regions": {}}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise FleetError(f"{path}: the rollout's progress file cannot be read ({e}); fix or remove it "
                         "(removing it rolls out every region again)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("regions"), dict):
        raise FleetError(f"{path}: not a rollout progress file; remove it to start over")
    return doc


def save_state(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # a run killed mid-write leaves the previous progress, never half a file


def record(state: dict, stack: str, status: str, fp: dict | None, *, error: str | None = None,
           now: dt.datetime | None = None) -> None:
    entry = {"status": status, "at": (now or dt.datetime.now(dt.timezone.utc)).isoformat(timespec="seconds")}
    if fp is not None:
        entry["fingerprint"] = fp
    if error:
        entry["error"] = error
    state["regions"][stack] = entry


# --- what a run does ---------------------------------------------------------------------------


@dataclass
class Step:
    stack: str
    run: bool  # False: skipped, done and unchanged
    why: str


@dataclass
class WavePlan:
    index: int
    wave: Wave
    steps: list[Step]
    gate: bool  # probe the wave's zones (ready, then the soak) before the next wave

    @property
    def to_run(self) -> list[str]:
        return [s.stack for s in self.steps if s.run]


def decide(stack: str, entry: dict | None, fp: dict) -> Step:
    if not entry:
        return Step(stack, True, "not rolled out yet")
    status, at = entry.get("status"), entry.get("at", "?")
    if status == FAILED:
        first = ((entry.get("error") or "").strip().splitlines() or ["?"])[0]
        return Step(stack, True, f"failed at {at}: {first[:200]}")
    if status not in (APPLIED, HEALTHY):
        return Step(stack, True, f"unknown progress {status!r}")
    old = entry.get("fingerprint") or {}
    if old.get("stackFile") != fp["stackFile"]:
        return Step(stack, True, f"done at {at}, but its stack file changed since")
    if old.get("program") != fp["program"]:
        return Step(stack, True, f"done at {at}, but the program (another Kontinuum version) changed since")
    old_files, files = old.get("files") or {}, fp.get("files") or {}
    if old_files != files:
        changed = sorted(n for n in set(old_files) | set(files) if old_files.get(n) != files.get(n))
        return Step(stack, True, f"done at {at}, but a file its config names changed since: {', '.join(changed)}")
    return Step(stack, False, f"done at {at}; stack file, the files it names and program unchanged")


def plan(waves: list[Wave], state: dict, fingerprints: dict[str, dict]) -> list[WavePlan]:
    """Each wave with what this run does to each region, and whether the wave is gated."""
    out = []
    for i, w in enumerate(waves, 1):
        steps = [decide(s, state["regions"].get(s), fingerprints[s]) for s in w.stacks]
        healthy = all(not st.run and state["regions"][st.stack].get("status") == HEALTHY for st in steps)
        out.append(WavePlan(i, w, steps, gate=not healthy))
    return out
