"""What `python -m kontinuum rollout` tells an operator (pure): the plan (`--preview`: waves in
order, each region's change summary or why it is skipped) and a run's outcome (per wave and
region: done, skipped, failed with the engine's error lines, not started; the gate's verdict)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kontinuum.preview_summary import RegionSummary, markdown as region_markdown
from kontinuum.rollout_plan import WavePlan


@dataclass
class RegionOutcome:
    stack: str
    status: str  # skipped | done | failed | not-started | invalid
    why: str = ""
    seconds: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@dataclass
class WaveOutcome:
    name: str
    soak: float
    status: str = "not started"  # not started | done | failed | unhealthy
    regions: list[RegionOutcome] = field(default_factory=list)
    gate: str | None = None  # what the health gate found, when it failed; "skipped" when not needed

    def to_json(self) -> dict:
        return asdict(self)


def _counts(counts: dict[str, int]) -> str:
    changed = ", ".join(f"{v} to {k}" for k, v in sorted(counts.items()) if k != "same")
    return changed or "no changes"


def _fenced(lines: list[str]) -> list[str]:
    return ["  ```", *[f"  {ln}" for text in lines for ln in text.splitlines()], "  ```"]


def _title(index: int, name: str) -> str:
    return f"Wave {index}" + ("" if name == f"wave {index}" else f" `{name}`")


def run_markdown(waves: list[WaveOutcome], *, state_path: str) -> str:
    lines = ["## Kontinuum rollout", ""]
    for i, w in enumerate(waves, 1):
        lines.append(f"### {_title(i, w.name)}: {w.status}")
        lines.append("")
        for r in w.regions:
            if r.status == "done":
                lines.append(f"- `{r.stack}`: up done in {r.seconds:.0f} s ({_counts(r.counts)})")
            elif r.status == "failed":
                took = f" after {r.seconds:.0f} s" if r.seconds is not None else ""
                lines.append(f"- `{r.stack}`: **up failed**{took}:")
                lines += _fenced(r.errors)
            elif r.status == "skipped":
                lines.append(f"- `{r.stack}`: skipped: {r.why}")
            else:
                lines.append(f"- `{r.stack}`: {r.why or 'not started'}")
        if w.gate and w.gate != "skipped":
            lines.append(f"- **health gate failed:** {w.gate.splitlines()[0]}")
            lines += _fenced(w.gate.splitlines()[1:]) if len(w.gate.splitlines()) > 1 else []
        elif w.status == "done":
            lines.append("- health gate: " + ("every zone was already healthy (nothing rolled out)" if w.gate
                                              else f"every zone ready and healthy for {w.soak:g} s"))
        lines.append("")
    lines.append(f"_progress: {state_path} (a re-run resumes with the regions not done)_")
    return "\n".join(lines) + "\n"


def plan_markdown(plans: list[WavePlan], previews: dict[str, RegionSummary], soaks: list[float]) -> str:
    lines = ["## Kontinuum rollout plan", "",
             "Waves in order; each starts once every zone of the one before is ready and stayed healthy "
             "for its soak. Regions of a wave run in parallel up to --parallel.", ""]
    for p, soak in zip(plans, soaks):
        lines.append(f"### {_title(p.index, p.wave.name)}: {', '.join(p.wave.stacks)} (soak {soak:g} s"
                     + ("" if p.gate else "; healthy before, not probed again") + ")")
        lines.append("")
        for step in p.steps:
            if not step.run:
                lines.append(f"- `{step.stack}`: skipped: {step.why}")
                continue
            lines.append(f"- `{step.stack}`: {step.why}")
            summary = previews.get(step.stack)
            if summary is not None:
                lines += ["", region_markdown(summary).replace("### Region", "#### Region", 1)]
        lines.append("")
    return "\n".join(lines) + "\n"


def invalid_markdown(problems: list[RegionSummary], title: str = "## Kontinuum rollout: nothing started") -> str:
    return title + "\n\n" + "\n".join(region_markdown(s) for s in problems)
