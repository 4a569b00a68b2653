"""Rank 0's output of a run, behind one object: the progress bar, TensorBoard, the run's JSON
files of record (``stats/val_step<k>.json``, ``stats/prune_stage<k>.json``), the printed lines
(phase table, prune and test lines, the summary) — the master-process pattern: every rank holds
a :class:`Reporter` and calls it at the same places; on ranks other than 0 each call does nothing
(the bar is disabled), so the stages that report need no rank test of their own.

What every rank writes for itself (its checkpoint shard, ``stats/train_step<k>_rank<r>.json``,
profile traces) is not here: those are per-rank files, written by their owners.

Lines go out as they did before this object existed: ``line`` through ``tqdm.write`` (above a live
progress bar), ``print`` through ``print(..., flush=True)``; tests and users grep some of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

from .fileio import atomic_write


class Reporter:
    """Rank ``rank``'s reporter: rank 0's outputs, a no-op on every other rank (``active`` False).
    ``result_dir``: the run's folder."""

    def __init__(self, result_dir: Path, rank: int):
        self.result_dir = Path(result_dir)
        self.active = rank == 0
        self.writer: Any = None  # TensorBoard SummaryWriter, opened by :meth:`open_tensorboard`
        self.bar: Any = None  # the training progress bar (:meth:`progress`)

    # ------------------------------------------------------------------ files
    def start_run(self, cfg_yaml: str) -> None:
        """The run's folder, ``cfg.yml`` and TensorBoard (rank 0)."""
        if not self.active:
            return
        self.result_dir.mkdir(parents=True, exist_ok=True)
        (self.result_dir / "cfg.yml").write_text(cfg_yaml)
        self.open_tensorboard()

    def open_tensorboard(self) -> None:
        """Open ``<result_dir>/tb`` (rank 0; the folder is created)."""
        if not self.active or self.writer is not None:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.result_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.result_dir / "tb"))

    def write_json(self, relative: str, obj: Any) -> Optional[Path]:
        """``<result_dir>/<relative>`` holding ``obj`` as indented JSON, written atomically (rank 0;
        returns the path there, None elsewhere)."""
        if not self.active:
            return None
        path = self.result_dir / relative
        atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=2)))
        return path

    # ------------------------------------------------------------------ TensorBoard
    def scalar(self, tag: str, value: Any, step: int) -> None:
        if self.writer is not None:
            self.writer.add_scalar(tag, value, step)

    def scalars(self, values: dict, step: int, prefix: str = "") -> None:
        """One scalar per entry of ``values`` whose value is not None."""
        for k, v in values.items():
            if v is not None:
                self.scalar(f"{prefix}{k}", v, step)

    def image(self, tag: str, image: Any, step: int) -> None:
        """An [H, W, 3] image (HWC)."""
        if self.writer is not None:
            self.writer.add_image(tag, image, step, dataformats="HWC")

    def close(self) -> None:
        """Close TensorBoard (it may be opened again)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    # ------------------------------------------------------------------ lines
    def line(self, text: str) -> None:
        """A line above the progress bar (tqdm.write; rank 0)."""
        if self.active:
            from tqdm import tqdm

            tqdm.write(text)

    def print(self, text: str) -> None:
        """A line on stdout, flushed (rank 0)."""
        if self.active:
            print(text, flush=True)

    def warn(self, text: str) -> None:
        """A line on stderr, flushed (rank 0)."""
        if self.active:
            print(text, file=sys.stderr, flush=True)

    def outputs(self, written: list, world_size: int) -> None:
        """The last line of a run, ``outputs: ...``, naming the files of the final step (a
        checkpoint of every rank, the PLY, metrics, renders, video) and the TensorBoard folder."""
        if not self.active:
            return
        names = []
        for path in written:
            if path.parent.name == "ckpts" and world_size > 1:
                path = path.with_name(path.name.replace("_rank0.pt", f"_rank{{0..{world_size - 1}}}.pt"))
            matches = len(list(path.parent.glob(path.name))) if "*" in path.name else 0
            names.append(f"{path} ({matches} files)" if matches else str(path))
        if (self.result_dir / "tb").is_dir():
            names.append(f"{self.result_dir / 'tb'}/ (TensorBoard)")
        self.print("outputs: " + ", ".join(names))

    def progress(self, steps: Iterable[int], initial: int, total: int):
        """The training progress bar over ``steps`` (disabled on other ranks: it still iterates)."""
        from tqdm import tqdm

        self.bar = tqdm(steps, initial=initial, total=total, disable=not self.active, dynamic_ncols=True)
        return self.bar

    def stop_progress(self, done: int) -> None:
        """Close the progress bar of a run that stops after ``done`` steps (a SIGTERM or SIGINT
        answered): it shows ``done``, the checkpoint's step (the bar counts a step when the next one
        is asked for, which a stopped loop never does)."""
        if self.bar is not None:
            self.bar.n = done
            self.bar.refresh()
            self.bar.close()
            self.bar = None
