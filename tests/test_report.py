"""Rank 0's outputs behind one object (trainer/report.py): a Reporter of another rank writes,
prints and logs nothing, so the stages that report need no rank test of their own."""

import json
from pathlib import Path

import pytest

from splat_train.trainer.report import Reporter

ROOT = Path(__file__).resolve().parent.parent


def test_inactive_reporter_does_nothing(tmp_path, capsys):
    r = Reporter(tmp_path / "run", rank=1)
    r.start_run("a: 1\n")
    r.open_tensorboard()
    assert r.write_json("stats/x.json", {"a": 1}) is None
    r.scalar("train/loss", 1.0, 1)
    r.scalars({"psnr": 1.0}, 1)
    r.line("line")
    r.print("print")
    r.outputs([tmp_path / "x.ply"], 2)
    assert list(r.progress(range(3), initial=0, total=3)) == [0, 1, 2]  # the bar still iterates
    r.close()
    assert not (tmp_path / "run").exists()
    out = capsys.readouterr()
    assert "line" not in out.out + out.err and "print" not in out.out and "outputs" not in out.out


def test_active_reporter_writes_and_prints(tmp_path, capsys):
    r = Reporter(tmp_path / "run", rank=0)
    r.start_run("a: 1\n")
    assert (tmp_path / "run" / "cfg.yml").read_text() == "a: 1\n" and (tmp_path / "run" / "tb").is_dir()
    path = r.write_json("stats/x.json", {"a": 1})
    assert path == tmp_path / "run" / "stats" / "x.json" and json.loads(path.read_text()) == {"a": 1}
    r.scalars({"psnr": 1.0, "lpips": None}, 1, prefix="val/")
    r.print("hello")
    r.outputs([path], 1)
    r.close()
    out = capsys.readouterr().out
    assert "hello\n" in out and f"outputs: {path}, {tmp_path / 'run' / 'tb'}/ (TensorBoard)" in out


@pytest.mark.parametrize("name", ["loop.py", "prune.py"])
def test_no_rank_branching_outside_the_reporter(name):
    assert "is_main" not in (ROOT / "trainer" / name).read_text()
