"""Per-rank checkpoints: ``ckpts/ckpt_<step>_rank<r>.pt``, written atomically.

A checkpoint holds the rank's shard (parameters), its Adam state, the means' LR scheduler, the
densification strategy's running state, the completed step count, the RNG states and the config.
Resuming with the same world size continues exactly; with another world size the shards (and
every per-Gaussian optimizer and strategy tensor) are concatenated in rank order and re-split
round-robin, as at initialization.

A run never overwrites, corrupts or mixes into a previous run's outputs: a result dir that holds
checkpoints is refused unless ``--resume`` (continue them) or ``--overwrite`` (move them aside
into ``superseded_<UTC time>/``; nothing is deleted); one that holds a run's other outputs but no
checkpoint (a run stopped before its first checkpoint: cfg.yml, tb/, stats/ ...) is refused the
same way, as there is nothing to resume; and every file goes to a temporary name first and is
renamed into place only when complete. A checkpoint that cannot be read (truncated, corrupted,
not a checkpoint) is a ValueError naming the file.
"""

from __future__ import annotations

import datetime
import re
import shutil
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from .fileio import atomic_write
from .shard import PER_GAUSSIAN_STATE

CKPT_RE = re.compile(r"ckpt_(\d+)_rank(\d+)\.pt$")  # the one naming of checkpoint files: file_name, parse_name


def file_name(step: int, rank: int) -> str:
    """``ckpt_<step>_rank<rank>.pt``: rank ``rank``'s checkpoint after ``step`` completed steps."""
    return f"ckpt_{step}_rank{rank}.pt"


def parse_name(name: str) -> Optional[tuple[int, int]]:
    """(step, rank) of a checkpoint file name (:func:`file_name`), None for any other name."""
    m = CKPT_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


PER_GAUSSIAN_STRATEGY_KEYS = PER_GAUSSIAN_STATE  # one home: shard.py
RUN_OUTPUTS = (
    "ckpts",
    "ply",
    "stats",
    "renders",
    "videos",
    "tb",
    "profile",
    "cfg.yml",
    "point_cloud",
    "cameras.json",
    "cfg_args",
)


def list_checkpoints(ckpt_dir: Path) -> dict[int, dict[int, Path]]:
    """{step: {rank: path}} of the complete-looking checkpoint files in ``ckpt_dir``."""
    found: dict[int, dict[int, Path]] = {}
    if not Path(ckpt_dir).is_dir():
        return found
    for p in Path(ckpt_dir).iterdir():
        parsed = parse_name(p.name)
        if parsed:
            found.setdefault(parsed[0], {})[parsed[1]] = p
    return found


def run_outputs(result_dir: Path) -> list[str]:
    """The names of RUN_OUTPUTS present in ``result_dir`` (folders with a trailing /)."""
    result_dir = Path(result_dir)
    return [
        name + ("/" if (result_dir / name).is_dir() else "") for name in RUN_OUTPUTS if (result_dir / name).exists()
    ]


def prepare_result_dir(
    result_dir: Path,
    resume: bool,
    overwrite: bool,
    evaluating: bool,
    auto_resume: bool = False,
    mutate: bool = True,
    log=None,
) -> bool:
    """Decide how a run uses ``result_dir`` and return whether it resumes.

    Refuses to start a new run in a folder holding another run's outputs (ValueError naming the
    folder and the flags that proceed); with ``overwrite``, moves those outputs into
    ``superseded_<UTC time>/`` first. A folder with outputs but no checkpoint (a run stopped before
    its first one) is refused too: the new run's TensorBoard events and stats would mix with the
    old ones. ``resume`` needs a complete, readable set (:func:`latest_complete`). ``auto_resume``
    (``--resume auto``): resume when there is such a set, else start afresh as ``overwrite`` does.
    ``evaluating`` (--ckpt) writes into any folder, as before. Only with ``mutate`` (the one
    process of the job that may: rank 0, or the launcher that spawns the ranks) is anything moved
    or cleaned (stale ``.*.tmp`` files of interrupted writes); every process decides the same.
    ``log``: a callable given a line for each skipped or ignored checkpoint file
    (:func:`latest_complete`) and one when outputs are moved aside."""
    result_dir = Path(result_dir)
    if resume or auto_resume:
        skipped: list[str] = []
        if latest_complete(result_dir / "ckpts", on_skip=skipped.append) is not None:
            for line in skipped if log is not None else []:  # resuming from an older set: say why
                log(line)
            if mutate:
                remove_stale_temporaries(result_dir)
            return True
        if not auto_resume:
            reasons = f" ({'; '.join(line.removeprefix('warning: ') for line in skipped)})" if skipped else ""
            raise ValueError(f"--resume: no complete, readable set of checkpoints in {result_dir / 'ckpts'}{reasons}")
        for line in skipped if log is not None else []:
            log(line)
        overwrite = True  # --resume auto with nothing to resume: a fresh start
        why = f"--resume auto: nothing to resume in {result_dir / 'ckpts'}; "
    else:
        why = "--overwrite: "
    existing = list_checkpoints(result_dir / "ckpts")
    outputs = run_outputs(result_dir)
    if not outputs or evaluating:
        if mutate and not evaluating:
            remove_stale_temporaries(result_dir)
        return False
    if not overwrite:
        if existing:
            raise ValueError(
                f"{result_dir} already holds another run's checkpoints (steps {sorted(existing)}); "
                "pass --resume to continue that run, --overwrite to start afresh (the old outputs are "
                "moved aside, not deleted), or choose another --result_dir"
            )
        raise ValueError(
            f"{result_dir} holds another run's outputs ({', '.join(outputs)}) but no checkpoint to resume "
            "(that run stopped before its first one); pass --overwrite to move them aside (not deleted) and "
            "start afresh, or choose another --result_dir"
        )
    if mutate:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        aside, n = result_dir / f"superseded_{stamp}", 1
        while aside.exists():  # a second move within the same second
            n += 1
            aside = result_dir / f"superseded_{stamp}_{n}"
        aside.mkdir()
        for name in RUN_OUTPUTS:
            if (result_dir / name).exists():
                shutil.move(str(result_dir / name), str(aside / name))
        if log is not None:
            log(f"{why}moved the previous run's outputs ({', '.join(outputs)}) to {aside}/ (nothing deleted)")
    return False


def remove_stale_temporaries(result_dir: Path) -> list[Path]:
    """Delete the ``.<name>.<random>.tmp`` files that writes interrupted by a kill left in
    ``result_dir`` and its output folders (fileio.atomic_write's temporaries: never a finished
    file); returns them."""
    result_dir = Path(result_dir)
    stale = []
    for folder in [result_dir, *(result_dir / name for name in RUN_OUTPUTS)]:
        if folder.is_dir():
            stale += [p for p in folder.iterdir() if p.is_file() and p.name.startswith(".") and p.name.endswith(".tmp")]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def save(ckpt_dir: Path, step: int, rank: int, world_size: int, state: dict) -> Path:
    """Write this rank's checkpoint for ``step`` completed steps; returns its path."""
    path = Path(ckpt_dir) / file_name(step, rank)
    payload = _to_cpu(dict(state, step=step, rank=rank, world_size=world_size))
    atomic_write(path, lambda tmp: torch.save(payload, tmp))
    return path


def check_readable(path: Path) -> None:
    """A cheap check that ``path`` is a complete PyTorch checkpoint: torch.save writes a zip
    archive whose central directory is at the end of the file, so a truncated file (or one that is
    no checkpoint at all) fails here in milliseconds, before a run spends time loading its data.
    Raises ValueError naming the file, on one line."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.namelist()
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(
            f"cannot read checkpoint {path}: not a complete PyTorch archive ({e}); the file is "
            "truncated, corrupted or not a checkpoint"
        ) from e


def read(path: Path) -> dict:
    """One checkpoint file, loaded onto the CPU.

    Raises ValueError naming the file, on one line, when it cannot be read (truncated, corrupted,
    not a PyTorch file) or is not a splat-train checkpoint (no 'params')."""
    check_readable(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError ... with its own text
        reason = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(
            f"cannot read checkpoint {path}: {type(e).__name__}: {reason}; the file is truncated or corrupted"
        ) from e
    if not isinstance(state, dict) or "params" not in state:
        raise ValueError(f"{path} is not a splat-train checkpoint (no 'params')")
    return state


def _recorded_world_size(path: Path) -> int:
    """The world size a checkpoint file records, read memory-mapped (nothing big is loaded).
    Raises ValueError naming the file when it cannot be read (:func:`check_readable`)."""
    check_readable(path)
    try:
        return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)["world_size"])
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError ...; KeyError: not ours
        reason = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"cannot read checkpoint {path}: {type(e).__name__}: {reason}") from e


def _set_of_step(step: int, files: dict[int, Path]) -> tuple[Optional[list[Path]], list[str]]:
    """(the files of ``step``'s set in rank order, or None when it is incomplete; the lines that
    say what is wrong). The set's world size is the one rank 0's file records (else the one most
    readable files record). A file that records another world size, or a rank beyond it, is a
    shard of another run left at the same step: named and ignored. A rank file of the set that is
    missing, unreadable (truncated, corrupted) or of another world size makes it incomplete: one
    line, naming each such file."""
    worlds: dict[int, int] = {}
    unreadable: dict[int, str] = {}
    for rank, path in sorted(files.items()):
        try:
            worlds[rank] = _recorded_world_size(path)
        except ValueError as e:
            unreadable[rank] = str(e)
    if 0 in worlds:
        world = worlds[0]
    elif worlds:
        world = Counter(worlds.values()).most_common(1)[0][0]
    else:  # nothing reads: the ranks present are the set's
        world = max(files) + 1
    folder = next(iter(files.values())).parent
    strays = [r for r, w in worlds.items() if w != world]
    strays += [r for r in unreadable if r >= world]
    problems = [unreadable[r] for r in sorted(unreadable) if r < world]
    problems += [
        f"{files[r].name} records world size {worlds[r]}, not the set's {world}" for r in sorted(strays) if r < world
    ]
    absent = [file_name(step, r) for r in range(world) if r not in files]
    if absent:
        problems.append(
            f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} missing from {folder} (the set has world size {world})"
        )
    lines = [f"warning: skipping the checkpoints of step {step}: {'; '.join(problems)}"] if problems else []
    ignored = sorted(r for r in strays if r >= world)
    if ignored:
        names = ", ".join(files[r].name for r in ignored)
        others = sorted({worlds[r] for r in ignored if r in worlds})
        lines.append(
            f"warning: ignoring {names} in {folder}: "
            + (f"shard(s) of a run of world size {', '.join(map(str, others))}" if others else "unreadable")
            + f", not of step {step}'s set of world size {world} (left by an earlier run)"
        )
    return (None if problems else [files[r] for r in range(world)]), lines


def latest_complete(ckpt_dir: Path, on_skip=None) -> Optional[tuple[int, list[Path]]]:
    """(step, files in rank order) of the newest step whose every rank's file exists, reads
    (:func:`check_readable`, and the world size it records, memory-mapped: nothing big is loaded)
    and records the set's world size. A newer set with a missing or unreadable rank file (a kill
    mid-write, a bad disk) is skipped for the next older one, and a stray shard of another world
    size at a step is ignored (:func:`_set_of_step`); each with one line to ``on_skip`` when
    given."""
    found = list_checkpoints(ckpt_dir)
    for step in sorted(found, reverse=True):
        files, lines = _set_of_step(step, found[step])
        for line in lines if on_skip is not None else []:
            on_skip(line)
        if files is not None:
            return step, files
    return None


def step_files(ckpt_dir: Path, step: Optional[int] = None) -> tuple[int, list[Path]]:
    """(step, one file per rank in rank order) of ``step``, or of the newest complete step.
    Raises ValueError naming the folder when there is no such step, or naming the missing ranks."""
    if step is None:
        found = latest_complete(ckpt_dir)
        if found is None:
            raise ValueError(f"no complete set of checkpoints in {ckpt_dir}")
        return found
    ranks = list_checkpoints(ckpt_dir).get(step)
    if not ranks:
        raise ValueError(f"no checkpoints for step {step} in {ckpt_dir}")
    world = read(next(iter(ranks.values())))["world_size"]
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        raise ValueError(f"step {step} in {ckpt_dir} lacks the shards of rank(s) {missing}")
    return step, [ranks[r] for r in range(world)]


def _merge_rows(parts: list[torch.Tensor], rank: int, world_size: int) -> torch.Tensor:
    return torch.cat(parts, dim=0)[rank::world_size].clone()


def load_shard(files: list[Path], rank: int, world_size: int) -> dict:
    """This rank's state from a run's checkpoint files (one per rank of that run, rank order).

    Same world size: the rank's own file as saved. Otherwise: every per-Gaussian tensor
    (parameters, Adam moments, strategy accumulators) concatenated in the old rank order and
    re-split ``rank::world_size``; scalars and RNG from old rank ``rank`` (or 0).
    Raises ValueError naming a file that cannot be read or is not a splat-train checkpoint
    (:func:`read`), and when the files are not exactly one per rank of one step of one run (a
    missing shard would drop its Gaussians).
    """
    states = [read(f) for f in files]
    by_rank = sorted(zip(files, states), key=lambda fs: int(fs[1].get("rank", 0)))
    files, states = [f for f, _ in by_rank], [st for _, st in by_rank]
    saved_world = {int(st.get("world_size", len(states))) for st in states}
    ranks = [int(st.get("rank", i)) for i, st in enumerate(states)]
    steps = {int(st.get("step", 0)) for st in states}
    if saved_world != {len(states)} or ranks != list(range(len(states))) or len(steps) != 1:
        raise ValueError(
            f"checkpoints {[str(f) for f in files]} are not one file per rank of one step "
            f"(ranks {ranks} of world size {sorted(saved_world)}, steps {sorted(steps)})"
        )
    if len(states) == world_size:
        return states[rank]
    base = dict(states[rank] if rank < len(states) else states[0])
    base["params"] = {k: _merge_rows([s["params"][k] for s in states], rank, world_size) for k in base["params"]}
    optimizers = {}
    for name, opt in base["optimizers"].items():
        merged = {"param_groups": opt["param_groups"], "state": {}}
        for key, value in opt["state"].items():
            merged["state"][key] = {
                k: (
                    _merge_rows([s["optimizers"][name]["state"][key][k] for s in states], rank, world_size)
                    if isinstance(v, torch.Tensor) and v.dim() > 0
                    else v
                )
                for k, v in value.items()
            }
        optimizers[name] = merged
    base["optimizers"] = optimizers
    strategy = dict(base["strategy_state"])
    for key in PER_GAUSSIAN_STRATEGY_KEYS:
        if isinstance(strategy.get(key), torch.Tensor):
            strategy[key] = _merge_rows([s["strategy_state"][key] for s in states], rank, world_size)
    base["strategy_state"] = strategy
    base["world_size"], base["rank"] = world_size, rank
    return base
