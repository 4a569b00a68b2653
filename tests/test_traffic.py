"""The bench's bytes model of the per-Gaussian stages (trainer/profiling.stage_traffic), the copy
bandwidth it is measured against, the visible counts the trainer keeps for it in timed steps, and
bench.md's table of them."""

from types import SimpleNamespace

import pytest
import torch

from splat_train.scripts import bench
from splat_train.trainer.profiling import copy_bandwidth, stage_traffic

# 10 Gaussians, one camera, 16 stored bases at degree 3, 4 of them visible
CASE = (10, 1, 16, 3, 4, 4)


def test_dense_stages_follow_the_projection_model_and_28_bytes_a_float():
    """Forward: 28 B of geometry each + 208 B (quaternion, 16 coefficients) each visible + a 52 B
    record and mask each; backward: 4 B mask + 236 B each visible + 36 B a visible record read,
    236 B written each; Adam: 59 floats x 28 B."""
    got = stage_traffic(*CASE)
    assert got == dict(
        projection=10 * 28 + 4 * 208 + 10 * 52,
        backward_projection=10 * 4 + 4 * 236 + 4 * 36 + 10 * 236,
        optimizer=28 * 59 * 10,
    )


def test_deferred_sh_adam_moves_the_listed_rows_only():
    """--lazy_sh_adam: the list and the catch-up of the visible rows on top of the forward, no SH
    gradient rows of the 6 unseen in the backward, which reads the list and the listed rows' bits
    instead of every bit, the geometry dense and the SH of the 4 listed (with their list and count)
    in Adam."""
    dense, lazy = stage_traffic(*CASE), stage_traffic(*CASE, lazy=True)
    assert lazy["projection"] == dense["projection"] + 10 * 4 + 4 * (8 + 24 * 48 + 32 + 12)
    # the list and the listed bits read, not every bit; the geometric zeros filled, the 4 seen rows again
    assert lazy["backward_projection"] == dense["backward_projection"] + 8 * 4 - 10 * 4 - 6 * 48 * 4 + 4 * 44
    assert lazy["optimizer"] == 28 * 11 * 10 + (28 * 48 + 8) * 4
    # without a loss term outside the projection: the 6 unseen rows' geometry neither written nor read
    bare = stage_traffic(*CASE, lazy=True, unseen_zeros=False)
    assert bare["backward_projection"] == lazy["backward_projection"] - 4 * 44 - 6 * 44
    assert bare["optimizer"] == lazy["optimizer"] + 4 * 10 * 4 - 6 * 44
    # of the 4 listed, the forward caught up the `waiting` ones: the others' rows only listed and checked
    for waiting in (0, 3):
        got = stage_traffic(*CASE, lazy=True, waiting=waiting)
        assert got["projection"] == dense["projection"] + 10 * 4 + 4 * 8 + waiting * (24 * 48 + 32 + 12)
        assert (got["backward_projection"], got["optimizer"]) == (lazy["backward_projection"], lazy["optimizer"])
    fused = stage_traffic(*CASE, fused_adam=True)
    assert fused["backward_projection"] is None and fused["optimizer"] is None
    assert fused["projection"] == dense["projection"]


def test_copy_bandwidth_is_a_positive_rate():
    assert copy_bandwidth(torch.device("cpu"), nbytes=1 << 24, repeats=3) > 1e6  # over 1 MB/s


def _fake_trainer(**plan):
    params = dict(means=torch.zeros(10, 3), shN=torch.zeros(10, 15, 3))
    return SimpleNamespace(
        plan=SimpleNamespace(**dict(dict(projection="triton", lazy_sh_adam=False, fused_adam=False), **plan)),
        params=params,
        shard=SimpleNamespace(lazy=None),  # no deferral: the unseen rows' zeros as written
        cfg=SimpleNamespace(step=SimpleNamespace(batch_size=1)),
        ctx=SimpleNamespace(world_size=1),
        sh_degree_at=lambda step: 3,
        device=torch.device("cpu"),
    )


# two timed steps: 4 and then 8 of the 10 Gaussians visible (one record each), twice the time
PHASES = [dict(projection=0.5, backward_projection=1.0, optimizer=2.0, rasterization=3.0)]
PHASES.append({k: 2 * v for k, v in PHASES[0].items()})
TIMED = [dict(ms=9.0, phases=PHASES[0], visible=(4, 4)), dict(ms=9.0, phases=PHASES[1], visible=(8, 8))]


def test_bench_sets_each_stage_against_its_floor(monkeypatch):
    """Each timed step's bytes at its own visible counts; bytes, ms and GB/s the medians over the
    steps (two: the means), the floor the median bytes at the copy bandwidth."""
    import splat_train.trainer.profiling as profiling

    monkeypatch.setattr(profiling, "copy_bandwidth", lambda device: 2e9)
    got = bench._stage_traffic(_fake_trainer(), TIMED, step=20)
    models = [stage_traffic(10, 1, 16, 3, v, v) for v in (4, 8)]
    assert got["copy_gbps"] == 2.0 and (got["visible"], got["visible_records"]) == (6, 6)
    assert set(got["stages"]) == {"projection", "backward_projection", "optimizer"}
    for name, st in got["stages"].items():
        nbytes = [m[name] for m in models]
        ms = [p[name] for p in PHASES]
        assert st["bytes"] == pytest.approx(sum(nbytes) / 2) and st["ms"] == pytest.approx(sum(ms) / 2)
        assert st["gbps"] == pytest.approx(sum(b / t / 1e6 for b, t in zip(nbytes, ms)) / 2)
        assert st["floor_ms"] == pytest.approx(sum(nbytes) / 2 / 2.0 / 1e6)
    assert bench._stage_traffic(_fake_trainer(projection="gsplat"), TIMED, step=20) is None
    assert bench._stage_traffic(_fake_trainer(), [dict(ms=1.0, phases=PHASES[0])], step=20) is None
    report = dict(variants=[dict(variant="v", world_size=1, ranks=[dict(traffic=got)])])
    lines = bench._traffic_lines(report)
    rows = [ln for ln in lines if ln.startswith("| v (W=1) | 6 | 2 |")]
    assert len(rows) == 3
    assert bench._traffic_lines(dict(variants=[dict(variant="v", world_size=1, ranks=[dict(traffic=None)])])) == []


def test_bench_models_the_rows_the_deferred_steps_caught_up(monkeypatch):
    """With --lazy_sh_adam each timed step's forward is modelled at the rows it caught up (its
    ``waiting``), whose median the table shows beside the visible ones."""
    import splat_train.trainer.profiling as profiling

    monkeypatch.setattr(profiling, "copy_bandwidth", lambda device: 2e9)
    trainer = _fake_trainer(lazy_sh_adam=True)
    timed = [dict(r, waiting=w) for r, w in zip(TIMED, (1, 3))]
    got = bench._stage_traffic(trainer, timed, step=20)
    models = [stage_traffic(10, 1, 16, 3, v, v, lazy=True, waiting=w) for v, w in ((4, 1), (8, 3))]
    assert got["waiting"] == 2
    assert got["stages"]["projection"]["bytes"] == pytest.approx(sum(m["projection"] for m in models) / 2)
    assert bench._stage_traffic(trainer, TIMED, step=20)["waiting"] is None  # no step deferred
    lines = bench._traffic_lines(dict(variants=[dict(variant="v", world_size=1, ranks=[dict(traffic=got)])]))
    assert len([ln for ln in lines if ln.startswith("| v (W=1) | 6 (2) | 2 |")]) == 3


def test_a_device_without_room_for_the_copy_gives_stages_without_floor(monkeypatch):
    import splat_train.trainer.profiling as profiling

    def full(device):
        raise torch.OutOfMemoryError("no room")

    monkeypatch.setattr(profiling, "copy_bandwidth", full)
    got = bench._stage_traffic(_fake_trainer(), TIMED, step=20)
    assert got["copy_gbps"] is None and got["stages"]["projection"]["floor_ms"] is None
    lines = bench._traffic_lines(dict(variants=[dict(variant="v", world_size=1, ranks=[dict(traffic=got)])]))
    assert "(no room)" in lines[-1] and lines[-1].endswith("| - | - |")


def test_a_step_asked_keeps_its_render_info():
    """Trainer.record_info (the bench's timed steps): the step keeps its RenderInfo, whose
    visible counts (render.visibility_counts) the bench reads; other steps keep none."""
    from splat_train.trainer.render import visibility_counts

    from test_gsplat_flags import trainer

    t = trainer("--max_steps", "3")
    t.train_step(0)
    assert t.last_info is None
    t.record_info = True
    t.train_step(1)
    visible, records = (int(v) for v in visibility_counts(t.last_info))
    assert 0 < visible <= t.shard.num and visible <= records
    t.record_info = False
    t.train_step(2)
    assert t.last_info is None
