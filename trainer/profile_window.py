"""``--profile``: a torch-profiler trace and a per-phase table over a window of training steps.

Per rank, under ``<result_dir>/profile/``: ``trace_rank<r>.json`` (Chrome / Perfetto; the phase
ranges are NVTX / roctx ranges), ``summary_rank<r>.json`` (profiling.summarize_trace, also
printed) and ``phases_rank<r>.json`` (the median ms of each phase of profiling.PHASES over the
window, also printed as a table). ``--profile_mode device`` records device activity only (no host
operators, no phase timer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from .checkpoint import atomic_write
from .profiling import PHASES, PhaseTimer, format_trace_summary, summarize_trace


class ProfileWindow:
    """The --profile window of a run that starts at step ``first_step``: ``schedule`` is the
    Config's Schedule (profile_start_step, profile_num_steps, max_steps), ``mode`` --profile_mode,
    ``timer`` the trainer's PhaseTimer, ``say`` / ``warn`` one-line outputs (rank 0's report).
    Call :meth:`before_step` and :meth:`after_step` around every step and :meth:`stop` at the end;
    ``active`` is False when the run starts after the window (nothing is profiled, said once)."""

    def __init__(
        self,
        result_dir: Path,
        rank: int,
        device: torch.device,
        schedule,
        mode: str,
        timer: PhaseTimer,
        first_step: int,
        say: Callable[[str], None],
        warn: Callable[[str], None],
    ):
        self.out_dir = Path(result_dir) / "profile"
        self.rank, self.schedule, self.timer, self.say = rank, schedule, timer, say
        self.device_only = mode == "device" and device.type == "cuda"
        self.phase_log: list = []
        self.prof: Optional[torch.profiler.profile] = None
        s = schedule
        first = max(s.profile_start_step, first_step)
        steps = min(s.profile_num_steps, s.max_steps - first)  # the window's steps this run reaches
        if steps < 1:  # resumed past the window
            warn(f"--profile: this run starts at step {first_step}, after the window; nothing is profiled")
            return
        if steps < s.profile_num_steps:
            warn(
                f"--profile: the window covers steps {first}-{first + steps - 1}, {steps} of --profile_num_steps "
                f"{s.profile_num_steps} (the run ends at step {s.max_steps})"
            )
        if mode == "device" and device.type != "cuda":
            warn("--profile_mode device: a CPU run has no device activity; its host operators are recorded")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        activities = [] if self.device_only else [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        wait = max(s.profile_start_step - first_step - 1, 0)
        self.prof = torch.profiler.profile(
            activities=activities,
            on_trace_ready=lambda prof: self._save(prof, steps),
            schedule=torch.profiler.schedule(
                wait=wait, warmup=1 if wait or first_step < s.profile_start_step else 0, active=steps, repeat=1
            ),
        )
        self.prof.start()

    @property
    def active(self) -> bool:
        return self.prof is not None

    def before_step(self, step: int) -> None:
        """Turn the phase timer on inside the window (no synchronization per step in it)."""
        if self.prof is not None and not self.device_only:
            s = self.schedule
            self.timer.switch(s.profile_start_step <= step < s.profile_start_step + s.profile_num_steps, deferred=True)

    def after_step(self, phases: dict) -> None:
        """``phases``: the step's PhaseTimer split (a CPU run's phases come at once)."""
        if self.prof is None:
            return
        self.prof.step()
        if self.timer.enabled and phases:
            self.phase_log.append(phases)

    def stop(self) -> None:
        """End the trace and write the per-phase table."""
        if self.prof is None:
            return
        self.prof.stop()
        self.phase_log += self.timer.collect()
        self._write_phase_table()

    def _save(self, prof, steps: int) -> None:
        trace_path = self.out_dir / f"trace_rank{self.rank}.json"
        prof.export_chrome_trace(str(trace_path))
        summary = summarize_trace(json.loads(trace_path.read_text()), steps)
        atomic_write(
            self.out_dir / f"summary_rank{self.rank}.json",
            lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2)),
        )
        self.say(format_trace_summary(summary))

    def _write_phase_table(self) -> None:
        """profile/phases_rank<r>.json and a printed table: median ms of each phase over the window."""
        log = self.phase_log
        if not log:
            return
        table = {p: float(np.median([row.get(p, 0.0) for row in log])) for p in (*PHASES, "total")}
        path = self.out_dir / f"phases_rank{self.rank}.json"
        atomic_write(
            path,
            lambda tmp: Path(tmp).write_text(json.dumps(dict(steps=len(log), median_ms=table, per_step=log), indent=2)),
        )
        total = table["total"] or 1.0
        lines = [f"{'phase':<22}{'ms':>9}{'share':>8}"]
        lines += [f"{p:<22}{table[p]:>9.3f}{100 * table[p] / total:>7.1f}%" for p in PHASES]
        lines.append(f"{'total':<22}{table['total']:>9.3f}")
        self.say("\n".join(lines))
