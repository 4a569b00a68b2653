"""Restartable runs: ``--resume auto``, the fallback past an unreadable checkpoint set,
stale temporaries, timed checkpoints, an absolute data_dir in cfg.yml."""

from pathlib import Path

import pytest
import torch

from splat_train.trainer import checkpoint
from splat_train.trainer.cli import main, parse_args

TINY = [
    "default",
    "--synthetic_image_size",
    "32",
    "--synthetic_num_cameras",
    "6",
    "--synthetic_num_gaussians",
    "80",
    "--num_traj_frames",
    "0",
    "--sh_degree",
    "0",
    "--device",
    "cpu",
    "--no_save_eval_images",
]


def test_resume_auto_is_an_alias_and_refuses_what_cannot_go_with_it():
    assert parse_args([*TINY, "--resume", "auto"]).distributed.auto_resume
    assert parse_args([*TINY, "--resume=auto"]).distributed.auto_resume
    cfg = parse_args([*TINY, "--resume"])
    assert cfg.distributed.resume and not cfg.distributed.auto_resume  # gsplat's switch keeps its meaning
    for extra in (["--overwrite"], ["--ckpt", "x.pt"]):
        with pytest.raises(ValueError, match="--resume auto"):
            parse_args([*TINY, "--resume", "auto", *extra])


def test_resume_auto_starts_fresh_then_continues(tmp_path, capsys):
    """The same command twice: the first run starts (moving a killed run's leftovers aside), the
    second continues from the first's checkpoint."""
    out = tmp_path / "run"
    (out / "tb").mkdir(parents=True)  # a run killed before its first checkpoint
    (out / "cfg.yml").write_text("old")
    command = [*TINY, "--resume", "auto", "--result_dir", str(out)]
    assert main([*command, "--max_steps", "4", "--save_steps", "4"]) == 0
    assert (out / "ckpts" / "ckpt_4_rank0.pt").is_file()
    aside = list(out.glob("superseded_*"))
    assert len(aside) == 1 and (aside[0] / "cfg.yml").read_text() == "old"
    capsys.readouterr()
    assert main([*command, "--max_steps", "6", "--save_steps", "6"]) == 0
    assert "resumed from step 4" in capsys.readouterr().out
    assert (out / "ckpts" / "ckpt_6_rank0.pt").is_file()
    assert torch.load(out / "ckpts" / "ckpt_6_rank0.pt", weights_only=False)["step"] == 6
    capsys.readouterr()
    assert main([*command, "--max_steps", "5"]) == 0  # the run is past it: says so, trains nothing
    printed = capsys.readouterr().out
    assert "nothing to train: the run is at step 6 and --max_steps is 5" in printed
    assert not (out / "ckpts" / "ckpt_5_rank0.pt").exists()


def _fake_set(ckpt_dir: Path, step: int, world: int, bad_rank=None) -> None:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        path = ckpt_dir / f"ckpt_{step}_rank{r}.pt"
        torch.save(dict(params={}, step=step, rank=r, world_size=world), path)
        if r == bad_rank:
            path.write_bytes(path.read_bytes()[:40])  # truncated under its final name


def test_latest_complete_falls_back_past_an_unreadable_or_incomplete_set(tmp_path):
    """A truncated rank file and a missing one are reported alike: one line each, naming the file."""
    _fake_set(tmp_path, 100, 2)
    _fake_set(tmp_path, 200, 2, bad_rank=1)
    _fake_set(tmp_path, 300, 3)
    (tmp_path / "ckpt_300_rank2.pt").unlink()  # incomplete
    skipped = []
    step, files = checkpoint.latest_complete(tmp_path, on_skip=skipped.append)
    assert step == 100 and [f.name for f in files] == ["ckpt_100_rank0.pt", "ckpt_100_rank1.pt"]
    assert len(skipped) == 2, skipped
    assert skipped[0].startswith("warning: skipping the checkpoints of step 300: ckpt_300_rank2.pt is missing")
    assert "world size 3" in skipped[0]
    assert skipped[1].startswith("warning: skipping the checkpoints of step 200: cannot read checkpoint ")
    assert "ckpt_200_rank1.pt" in skipped[1]


def test_a_stray_shard_of_another_world_size_is_named_and_ignored(tmp_path):
    """A world-size-1 set at step 34 beside a leftover rank-2 file of a 3-rank run at the same
    step: the newest set still wins, and a line names the leftover."""
    _fake_set(tmp_path, 30, 1)
    _fake_set(tmp_path, 34, 3)
    (tmp_path / "ckpt_34_rank1.pt").unlink()
    _fake_set(tmp_path, 34, 1)  # rank 0's file replaced by the newer run's
    lines = []
    step, files = checkpoint.latest_complete(tmp_path, on_skip=lines.append)
    assert step == 34 and [f.name for f in files] == ["ckpt_34_rank0.pt"]
    assert len(lines) == 1 and lines[0].startswith("warning: ignoring ckpt_34_rank2.pt in ")
    assert "world size 3" in lines[0] and "world size 1" in lines[0]
    # a shard of another world size among the set's own ranks breaks the set: named, and the older one wins
    _fake_set(tmp_path, 40, 2)
    torch.save(dict(params={}, step=40, rank=1, world_size=3), tmp_path / "ckpt_40_rank1.pt")
    lines.clear()
    assert checkpoint.latest_complete(tmp_path, on_skip=lines.append)[0] == 34
    assert lines[0] == (
        "warning: skipping the checkpoints of step 40: ckpt_40_rank1.pt records world size 3, not the set's 2"
    )


def test_resume_says_which_files_it_skipped_and_when_it_moves_outputs(tmp_path):
    """Through prepare_result_dir (what main calls): the lines reach its log; --overwrite and
    --resume auto with nothing to resume each say where the old outputs went."""
    _fake_set(tmp_path / "ckpts", 10, 1)
    _fake_set(tmp_path / "ckpts", 12, 2)
    (tmp_path / "ckpts" / "ckpt_12_rank1.pt").unlink()
    lines = []
    assert checkpoint.prepare_result_dir(tmp_path, True, False, False, log=lines.append) is True
    assert lines == [
        f"warning: skipping the checkpoints of step 12: ckpt_12_rank1.pt is missing from {tmp_path / 'ckpts'} "
        "(the set has world size 2)"
    ]
    lines.clear()
    assert checkpoint.prepare_result_dir(tmp_path, False, True, False, log=lines.append) is False
    (aside,) = tmp_path.glob("superseded_*")
    assert lines == [f"--overwrite: moved the previous run's outputs (ckpts/) to {aside}/ (nothing deleted)"]
    (tmp_path / "cfg.yml").write_text("old")
    lines.clear()
    assert checkpoint.prepare_result_dir(tmp_path, False, False, False, auto_resume=True, log=lines.append) is False
    assert len(lines) == 1 and lines[0].startswith(f"--resume auto: nothing to resume in {tmp_path / 'ckpts'}; moved ")
    assert "(cfg.yml)" in lines[0]


def test_resume_refuses_when_no_set_reads(tmp_path):
    _fake_set(tmp_path / "ckpts", 50, 1, bad_rank=0)
    with pytest.raises(ValueError, match="no complete, readable set"):
        checkpoint.prepare_result_dir(tmp_path, resume=True, overwrite=False, evaluating=False)
    # --resume auto starts afresh instead, moving the unreadable run aside
    assert (
        checkpoint.prepare_result_dir(tmp_path, resume=False, overwrite=False, evaluating=False, auto_resume=True)
        is False
    )
    assert not (tmp_path / "ckpts").exists() and len(list(tmp_path.glob("superseded_*/ckpts"))) == 1


def test_only_the_mutating_process_moves_or_cleans(tmp_path):
    (tmp_path / "stats").mkdir()
    (tmp_path / "stats" / ".val_step5.json.abc123.tmp").write_text("half")
    (tmp_path / "stats" / "val_step5.json").write_text("{}")
    checkpoint.prepare_result_dir(tmp_path, False, True, False, mutate=False)  # rank 1 of a launch
    assert (tmp_path / "stats" / "val_step5.json").exists() and not list(tmp_path.glob("superseded_*"))
    checkpoint.prepare_result_dir(tmp_path, False, True, False, mutate=True)  # rank 0
    assert not (tmp_path / "stats").exists() and len(list(tmp_path.glob("superseded_*/stats"))) == 1


def test_stale_temporaries_are_removed_and_finished_files_kept(tmp_path):
    (tmp_path / "ckpts").mkdir()
    stale = tmp_path / "ckpts" / ".ckpt_10_rank0.pt.x1y2.tmp"
    stale.write_bytes(b"partial")
    kept = tmp_path / "ckpts" / "ckpt_5_rank0.pt"
    kept.write_bytes(b"done")
    assert checkpoint.remove_stale_temporaries(tmp_path) == [stale]
    assert not stale.exists() and kept.exists()


def test_timed_checkpoints(tmp_path, monkeypatch):
    """--save_every_minutes writes a checkpoint at the first step boundary after the interval."""
    from splat_train.trainer import loop

    clock = [0.0]
    monkeypatch.setattr(loop.time, "monotonic", lambda: clock[0])
    real = loop.Trainer.train_step

    def step(self, s):
        clock[0] += 25.0  # each step "takes" 25 s
        return real(self, s)

    monkeypatch.setattr(loop.Trainer, "train_step", step)
    assert (
        main(
            [
                *TINY,
                "--max_steps",
                "6",
                "--save_steps",
                "100",
                "--save_every_minutes",
                "1",
                "--result_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    steps = sorted(checkpoint.list_checkpoints(tmp_path / "ckpts"))
    assert steps == [3, 6]  # 75 s after the start, then the last step


def test_save_every_writes_a_checkpoint_every_n_steps(tmp_path):
    """--save_every N: checkpoints at every N-th step (and the last), scaled by --steps_scaler as
    the other step counts are; 0 (off) stays off when scaled."""
    assert parse_args([*TINY, "--save_every", "4", "--steps_scaler", "0.5"]).schedule.save_every == 2
    assert parse_args([*TINY, "--steps_scaler", "0.5"]).schedule.save_every == 0
    with pytest.raises(ValueError, match="--save_every"):
        parse_args([*TINY, "--save_every", "-1"])
    command = [*TINY, "--max_steps", "7", "--save_steps", "100", "--save_every", "3", "--result_dir", str(tmp_path)]
    assert main(command) == 0
    assert sorted(checkpoint.list_checkpoints(tmp_path / "ckpts")) == [3, 6, 7]


def test_cfg_yml_holds_an_absolute_data_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scene").mkdir()
    cfg = parse_args(["default", "--data_dir", "scene"])
    assert cfg.data.data_dir == tmp_path / "scene" and cfg.data.data_dir.is_absolute()
