"""ByteSplat's pruning stages (trainer/prune.py): the max-contribution winners against a brute-force
compositing loop; stage 2 removes exactly the never-winning Gaussians; stage 3 moves tiles under
the budget without removing more than needed; parameter / Adam / strategy state stay consistent;
W = 2 and 3 ranks prune exactly what one process holding every Gaussian prunes; a CLI run."""

import json
import math

import pytest
import torch
import yaml

from splat_train.kernels import reference
from splat_train.trainer import prune, shard
from splat_train.trainer.launch import DistContext, launch
from splat_train.trainer.render import CameraBatch, render

from test_distributed import make_cameras, make_scene, shard_order

FLAGS = [
    "--synthetic_image_size",
    "32",
    "--synthetic_num_cameras",
    "6",
    "--synthetic_num_gaussians",
    "120",
    "--sh_degree",
    "1",
    "--num_traj_frames",
    "0",
    "--max_steps",
    "20",
    "--refine_start_iter",
    "0",
    "--refine_every",
    "1000",
    "--init_scale",
    "0.5",
]


def make_trainer(flags=(), ctx=None, result_dir=None):
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.loop import Trainer

    extra = ["--result_dir", str(result_dir)] if result_dir else []
    cfg = parse_args(["default", *FLAGS, *flags, *extra])
    return Trainer(cfg, ctx or DistContext(), build_scene(cfg))


# ---------------------------------------------------------------- winners vs brute force


def brute_force(info):
    """Per record: pixels won and sum of alpha * T, by compositing each pixel's tile list front to
    back with gsplat's rules (RasterizeToPixels3DGSFwd.cu), one Gaussian at a time."""
    rec, W, H, ts = info.records, info.width, info.height, 16
    m2d, con, opa = rec.means2d.reshape(-1, 2), rec.conics.reshape(-1, 3), rec.opacities.reshape(-1)
    offsets, flat = info.tiles.offsets.reshape(-1).tolist(), info.tiles.flatten_ids.tolist()
    ends = offsets[1:] + [len(flat)]
    tw = info.tiles.tile_width
    wins, importance = torch.zeros(opa.numel()), torch.zeros(opa.numel(), dtype=torch.float64)
    for y in range(H):
        for x in range(W):
            t = (y // ts) * tw + x // ts
            T, best, best_w = 1.0, None, -1.0
            for r in flat[offsets[t] : ends[t]]:
                dx, dy = float(m2d[r, 0]) - (x + 0.5), float(m2d[r, 1]) - (y + 0.5)
                a, b, c = (float(v) for v in con[r])
                sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
                alpha = min(0.999, float(opa[r]) * math.exp(-sigma))
                if sigma < 0 or alpha < 1.0 / 255.0:
                    continue
                if T * (1.0 - alpha) <= 1e-4:
                    break
                importance[r] += alpha * T
                if alpha * T > best_w:
                    best, best_w = r, alpha * T
                T *= 1.0 - alpha
            if best is not None:
                wins[best] += 1
    return wins, importance


def test_winners_match_brute_force():
    params = make_scene(seed=3, num_gaussians=60, sh_degree=0)
    params["opacities"] = params["opacities"].clamp(max=0.6)  # long lists: many candidates per pixel
    ((viewmat, K, w, h, _),) = make_cameras([(40, 32)])
    cams = CameraBatch(viewmat[None], K[None], w, h)
    res = render(params, cams, DistContext(), reference, 0, rasterize=False)
    values, counts = prune.record_statistics(res.info, budget=10, composite=True)
    wins, importance = brute_force(res.info)
    assert wins.sum() > 0.5 * w * h and (wins > 0).sum() > 5  # the comparison means something
    assert torch.equal(values[..., 0].reshape(-1).float(), wins)
    assert torch.allclose(values[..., 1].reshape(-1), importance, rtol=1e-4, atol=1e-5)
    # overload lane: per record, sum over its tiles of max(0, n_t - budget)
    excess = (counts - 10).clamp_min(0).double()
    tiles_of = {}
    starts = res.info.tiles.offsets.reshape(-1).tolist() + [res.info.tiles.flatten_ids.numel()]
    for t in range(len(starts) - 1):
        for r in res.info.tiles.flatten_ids[starts[t] : starts[t + 1]].tolist():
            tiles_of.setdefault(r, []).append(t)
    expected = torch.zeros(values[..., 2].numel(), dtype=torch.float64)
    for r, ts in tiles_of.items():
        expected[r] = sum(excess[t] for t in ts)
    assert torch.equal(values[..., 2].reshape(-1), expected)


def test_pixel_winners_tie_goes_to_lower_key():
    pixel_ids = torch.tensor([0, 0, 0, 1, 1])
    record_ids = torch.tensor([4, 2, 3, 1, 0])
    weights = torch.tensor([0.5, 0.5, 0.1, 0.2, 0.3])
    keys = torch.tensor([9, 8, 7, 6, 5])  # record 4 has key 5 < record 2's key 7
    assert prune.pixel_winners(pixel_ids, record_ids, weights, keys).tolist() == [4, 0]


# ---------------------------------------------------------------- single-process stages


def _state_consistent(trainer):
    n = trainer.params["means"].shape[0]
    for name, p in trainer.params.items():
        assert p.shape[0] == n, name
        opt = trainer.optimizers[name]
        assert opt.param_groups[0]["params"][0] is p
        for key, v in opt.state[p].items():
            if key != "step":
                assert v.shape == p.shape, (name, key)
    for key in shard.PER_GAUSSIAN_STATE:
        v = trainer.strategy_state.get(key)
        if isinstance(v, torch.Tensor):
            assert v.shape[0] == n, key


def test_stage2_removes_exactly_the_never_winning():
    tr = make_trainer(["--prune_stage2_step", "2"])
    for step in range(2):
        tr.train_step(step)
    assert isinstance(tr.strategy_state["grad2d"], torch.Tensor)  # per-Gaussian state exists
    before = {k: v.detach().clone() for k, v in tr.params.items()}
    moments = tr.optimizers["means"].state[tr.params["means"]]["exp_avg"].clone()
    grad2d = tr.strategy_state["grad2d"].clone()
    wins = prune.measure(tr.shard, tr.setup, tr.trainset, budget=64).wins
    keep = wins > 0
    assert 0 < int(keep.sum()) < keep.numel()
    stats = prune.initial_pruning(tr.shard, tr.setup, tr.trainset, tr.cfg, 2)
    assert stats["num_after"] == int(keep.sum()) and stats["num_before"] == keep.numel()
    for k, v in tr.params.items():
        assert torch.equal(v.detach(), before[k][keep]), k
    assert torch.equal(tr.optimizers["means"].state[tr.params["means"]]["exp_avg"], moments[keep])
    assert torch.equal(tr.strategy_state["grad2d"], grad2d[keep])
    _state_consistent(tr)
    assert tr.strategy.refine_stop_iter == 2  # densification off from here on
    n = tr.params["means"].shape[0]
    for step in range(2, 5):  # fine-tuning continues; the strategy no longer changes the count
        out = tr.train_step(step)
        assert torch.isfinite(out["loss"]) and out["num_gaussians"] == n
    _state_consistent(tr)


def test_stage3_reaches_the_budget():
    tr = make_trainer(["--prune_rounds", "30", "--prune_fraction", "0.25"])
    first = prune.measure(tr.shard, tr.setup, tr.trainset, budget=64)
    budget = max(1, first.max_per_tile // 2)
    tr.cfg.prune.tile_budget = budget
    stats = prune.hardware_aware_pruning(tr.shard, tr.setup, tr.trainset, tr.cfg, 1)
    assert stats["tiles_before"]["fraction_within_budget"] < stats["tiles_after"]["fraction_within_budget"]
    assert stats["all_tiles_fit"] and stats["tiles_after"]["max_per_tile"] <= budget
    assert stats["rounds"] < 30 and stats["num_after"] == tr.params["means"].shape[0] > 0
    _state_consistent(tr)
    for step in range(3):
        assert torch.isfinite(tr.train_step(step)["loss"])


def test_measurement_sums_the_over_budget_tiles_and_sizes_the_round():
    """excess / over_isects are the sums over every (view, tile) pair over the budget of n_t - B
    and n_t (counted here view by view), and a round's estimate is candidates * excess / over_isects."""
    from splat_train.trainer.model import activated

    tr = make_trainer()
    budget = 6
    m = prune.measure(tr.shard, tr.setup, tr.trainset, budget, composite=False)
    excess = over = 0
    for i in range(len(tr.trainset)):
        cam = tr.setup.camera_batch(tr.trainset.batch([i]))
        res = render(
            activated(tr.params),
            cam,
            tr.ctx,
            tr.ops,
            0,
            packed=tr.cfg.step.packed,
            near=tr.cfg.step.near_plane,
            far=tr.cfg.step.far_plane,
            rasterize=False,
        )
        counts = prune.tile_counts(res.info.tiles.offsets, res.info.tiles.flatten_ids.numel())
        excess += int((counts[counts > budget] - budget).sum())
        over += int(counts[counts > budget].sum())
    assert excess > 0 and (m.excess, m.over_isects) == (excess, over)
    assert m.removals_needed(1000) == math.ceil(1000 * excess / over) < 1000
    fits = prune.measure(tr.shard, tr.setup, tr.trainset, m.max_per_tile, composite=False)
    assert (fits.excess, fits.over_isects, fits.removals_needed(1000)) == (0, 0, 0)


def test_stage3_removes_no_more_than_needed():
    tr = make_trainer(["--prune_rounds", "1", "--prune_fraction", "1.0"])
    m = prune.measure(tr.shard, tr.setup, tr.trainset, budget=64)
    # every tile fits: nothing to do
    tr.cfg.prune.tile_budget = m.max_per_tile
    stats = prune.hardware_aware_pruning(tr.shard, tr.setup, tr.trainset, tr.cfg, 1)
    assert stats["num_after"] == stats["num_before"] == m.wins.numel() and stats["rounds"] == 0
    # the fullest tile is one over: one round removes one Gaussian, the top-scoring candidate
    budget = m.max_per_tile - 1
    tr.cfg.prune.tile_budget = budget
    m = prune.measure(tr.shard, tr.setup, tr.trainset, budget)
    scores = prune.stage3_scores(m, budget)
    top = int(torch.argmax(torch.where(m.overload > 0, scores, -1.0)))
    expected = {k: torch.cat([v[:top], v[top + 1 :]]) for k, v in tr.params.items()}
    stats = prune.hardware_aware_pruning(tr.shard, tr.setup, tr.trainset, tr.cfg, 1)
    assert stats["num_before"] - stats["num_after"] == 1 and stats["per_round"][0]["removed"] == 1
    for k, v in tr.params.items():
        assert torch.equal(v.detach(), expected[k].detach()), k


# ---------------------------------------------------------------- batched passes vs one view per pass


def per_view_measure(shard_, setup, views, budget, composite=True):
    """The measurement one view per pass, its tile statistics read view by view (the stages'
    earlier implementation): what the batched passes of prune.measure must equal."""
    from splat_train.trainer import exchange
    from splat_train.trainer.render import route_to_owners

    ctx = setup.ctx
    mine, rounds = exchange.deal_views(len(views), ctx)
    picks = exchange.padded_rounds(mine, rounds)
    gaussians = shard_.activated()
    acc = torch.zeros(shard_.num, 3, dtype=torch.float64)
    tiles = torch.zeros(1, 6, dtype=torch.float64)
    for r in range(rounds):
        res = setup(gaussians, setup.camera_batch(views.batch([picks[r]], images=False)), 0, rasterize=False)
        values, counts = prune.record_statistics(res.info, budget, composite)
        if r < len(mine):
            over = counts > budget
            tiles[0, :3] += torch.tensor([counts.numel(), int((~over).sum()), int(counts.sum())])
            tiles[0, 3] = max(float(tiles[0, 3]), float(counts.max()) if counts.numel() else 0.0)
            tiles[0, 4:] += torch.tensor([int((counts[over] - budget).sum()), int(counts[over].sum())])
        else:
            values = torch.zeros_like(values)
        acc += route_to_owners(ctx, res.info, values)
    tiles = exchange.all_gather_rows(ctx, tiles)
    num_tiles, num_within, total = (int(v) for v in tiles[:, :3].sum(0))
    excess, over_isects = (int(v) for v in tiles[:, 4:].sum(0))
    return prune.Measurement(
        acc[:, 0], acc[:, 1], acc[:, 2], num_tiles, num_within, total / max(num_tiles, 1), int(tiles[:, 3].max()),
        excess, over_isects,
    )  # fmt: skip


def per_round_select_top(ctx, scores, candidates, k):
    """The earlier selection: gathered on the host, sorted by global index, then stably by score."""
    from splat_train.trainer import exchange

    offset, _ = prune.global_offset(ctx, scores.shape[0])
    local = candidates.nonzero().squeeze(1)
    rows = torch.stack([scores[local], (local + offset).double()], dim=1).cpu()
    everyone = exchange.all_gather_rows(ctx, rows)
    by_index = everyone[torch.argsort(everyone[:, 1], stable=True)]
    order = torch.argsort(-by_index[:, 0], stable=True)
    chosen = by_index[order[:k], 1].long() - offset
    mask = torch.zeros(scores.shape[0], dtype=torch.bool)
    mask[chosen[(chosen >= 0) & (chosen < scores.shape[0])]] = True
    return mask


def per_round_stage3(tr):
    """Stage 3 as the earlier round loop (per-view measurements, the host selection)."""
    p, ctx = tr.cfg.prune, tr.setup.ctx
    budget = prune.tile_budget(ctx.device, p.tile_budget)
    m = per_view_measure(tr.shard, tr.setup, tr.trainset, budget)
    rounds = 0
    while rounds < p.prune_rounds and m.max_per_tile > budget:
        candidates = m.overload > 0
        k = min(math.ceil(p.prune_fraction * int(candidates.sum())), m.removals_needed(int(candidates.sum())))
        tr.shard.remove(per_round_select_top(ctx, prune.stage3_scores(m, budget), candidates, k))
        rounds += 1
        m = per_view_measure(tr.shard, tr.setup, tr.trainset, budget)
    return rounds, m


def assert_same_measurement(got, want):
    assert torch.equal(got.wins, want.wins) and torch.equal(got.overload, want.overload)
    torch.testing.assert_close(got.importance, want.importance, rtol=1e-6, atol=1e-9)
    for name in ("num_tiles", "num_within", "mean_per_tile", "max_per_tile", "excess", "over_isects"):
        assert getattr(got, name) == getattr(want, name), name


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_batched_measurement_equals_one_view_per_pass(packed):
    """Several views per pass (1, 2, 4 and as memory allows: all of them) measure what one view
    per pass does, view by view: pixels won, overload and tile statistics exactly, importance to
    float rounding."""
    tr = make_trainer(["--init_opa", "0.3"] + (["--packed"] if packed else []))
    want = per_view_measure(tr.shard, tr.setup, tr.trainset, 12)
    assert want.wins.sum() > 1000 and want.excess > 0 and (want.wins == 0).any()  # means something
    for per_pass in (1, 2, 4, 0):
        assert_same_measurement(prune.measure(tr.shard, tr.setup, tr.trainset, 12, per_pass=per_pass), want)
    tiles_only = prune.measure(tr.shard, tr.setup, tr.trainset, 12, composite=False, per_pass=4)
    assert not tiles_only.wins.any() and torch.equal(tiles_only.overload, want.overload)


def test_views_per_pass_fills_the_memory_share():
    """As many views as PASS_MEMORY_SHARE of the free memory holds, at least 1, at most
    MAX_VIEWS_PER_PASS and no more than int32 counts; a CPU rank counts HOST_PASS_BYTES as free."""
    from splat_train.trainer.launch import DistContext

    ctx = DistContext()
    assert prune.free_bytes(torch.device("cpu")) == prune.HOST_PASS_BYTES
    mib = 2**20 // prune.ISECT_BYTES  # intersections of 1 MiB
    assert prune.views_per_pass(ctx, (0, mib, 0), 0, free=16 * 2**20) == 4  # a quarter of 16 MiB / 1 MiB
    assert prune.views_per_pass(ctx, (0, 0, 2**20), 8, free=64 * 2**20) == 2  # 8 bytes per pixel
    assert prune.views_per_pass(ctx, (0, 1024 * mib, 0), 0, free=2**20) == 1
    assert prune.views_per_pass(ctx, (1, 1, 1), 0, free=2**50) == prune.MAX_VIEWS_PER_PASS
    assert prune.views_per_pass(ctx, (2**29, 0, 0), 0, free=2**50) == 3  # 4 x 2^29 records overflow int32


def test_view_batches_share_one_image_size():
    class Views:
        sizes = {0: (32, 32), 1: (40, 30), 2: (32, 32), 3: (32, 32), 4: (40, 30), 5: (32, 32)}

        def size(self, i):
            return self.sizes[i]

    assert prune.view_batches([0, 1, 2, 3, 4, 5], Views(), 2) == [[0, 2], [3, 5], [1, 4]]
    assert prune.view_batches([1, 3], Views(), 4) == [[1], [3]]
    assert prune.view_batches([], Views(), 4) == []


def test_stage3_rounds_equal_the_round_loop():
    """Stage 3 with batched measurements and the device-side selection removes exactly the
    Gaussians the earlier round loop (one view per pass, selection on the host) removes."""
    flags = ["--tile_budget", "30", "--prune_rounds", "3", "--prune_fraction", "0.15", "--init_opa", "0.3"]
    tr, reference_tr = make_trainer(flags), make_trainer(flags)
    stats = prune.hardware_aware_pruning(tr.shard, tr.setup, tr.trainset, tr.cfg, 1)
    rounds, last = per_round_stage3(reference_tr)
    assert stats["rounds"] == rounds == 3 and stats["num_after"] < stats["num_before"]
    assert all(r["removed"] < r["candidates"] for r in stats["per_round"])  # the ranking decides
    for k, v in tr.params.items():
        assert torch.equal(v.detach(), reference_tr.params[k].detach()), k
    assert stats["tiles_after"] == last.tile_summary()


# ---------------------------------------------------------------- distributed equality


def _prune_rank(ctx, flags, out_dir, per_pass=0):
    torch.set_num_threads(1)
    prune.MAX_VIEWS_PER_PASS = per_pass or prune.MAX_VIEWS_PER_PASS  # this child's own module
    tr = make_trainer(flags, ctx)
    s2, s3 = (
        prune.initial_pruning(tr.shard, tr.setup, tr.trainset, tr.cfg, 1),
        prune.hardware_aware_pruning(tr.shard, tr.setup, tr.trainset, tr.cfg, 2),
    )
    torch.save(
        dict(params={k: v.detach() for k, v in tr.params.items()}, stats=(s2, s3)), f"{out_dir}/prune{ctx.rank}.pt"
    )


@pytest.mark.parametrize(
    "world_size, packed, per_pass, cameras",
    [(2, False, 0, 6), (2, True, 2, 8), (3, True, 0, 6)],
    ids=["W2-dense", "W2-packed-2-per-pass", "W3-packed"],
)
def test_distributed_pruning_equals_single_process(tmp_path, world_size, packed, per_pass, cameras):
    """Every rank's shard after both stages is its part of what one process prunes. With 2 views
    per pass, 7 training views: rank 0 renders 1 + 2 + 1 views, rank 1 1 + 2 and a padding pass."""
    from splat_train.trainer.model import create_optimizers

    # Gaussians in input order: shard_order below maps the one process's rows onto the ranks' rows
    flags = ["--tile_budget", "40", "--prune_rounds", "3", "--prune_fraction", "0.2", "--init_opa", "0.3"]
    flags += ["--synthetic_num_cameras", str(cameras), "--no_morton_order"] + (["--packed"] if packed else [])
    assert launch(_prune_rank, (flags, str(tmp_path), per_pass), nproc_per_node=world_size, device="cpu") == 0
    outs = [torch.load(tmp_path / f"prune{r}.pt") for r in range(world_size)]

    single = make_trainer(flags)
    order = shard_order(single.params["means"].shape[0], world_size)
    single.params = torch.nn.ParameterDict(
        {k: torch.nn.Parameter(v.detach()[order].clone()) for k, v in single.params.items()}
    )
    single.optimizers = create_optimizers(single.params, single.cfg, 1, single.scene_scale)
    s2, s3 = (
        prune.initial_pruning(single.shard, single.setup, single.trainset, single.cfg, 1),
        prune.hardware_aware_pruning(single.shard, single.setup, single.trainset, single.cfg, 2),
    )
    assert s2["num_after"] < s2["num_before"] and s3["num_after"] < s3["num_before"]  # both stages prune
    for k, v in single.params.items():
        merged = torch.cat([o["params"][k] for o in outs])
        assert torch.equal(merged, v.detach()), k
    for o in outs:  # every rank reports the same global statistics
        assert o["stats"][1]["tiles_after"] == s3["tiles_after"] and o["stats"][0]["num_after"] == s2["num_after"]


# ---------------------------------------------------------------- end to end


def test_cli_runs_both_stages(tmp_path, capsys):
    """Both stages run from the preset's command line, each line ending in the stage's seconds,
    which its stats file records; at W = 1 the preset trains dense records and says so."""
    import re

    from splat_train.trainer.cli import main

    rc = main(
        [
            "bytesplat",
            *FLAGS,
            "--max_steps",
            "6",
            "--refine_stop_iter",
            "3",
            "--prune_stage2_step",
            "3",
            "--prune_stage3_step",
            "5",
            "--tile_budget",
            "60",
            "--prune_rounds",
            "2",
            "--test_every",
            "3",
            "--result_dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    for k, step in ((2, 3), (3, 5)):
        stats = json.loads((tmp_path / "stats" / f"prune_stage{k}.json").read_text())
        assert stats["stage"] == k and stats["num_after"] <= stats["num_before"]
        assert 0.0 <= stats["tiles_after"]["fraction_within_budget"] <= 1.0
        assert math.isfinite(stats["test_psnr_after"])
        assert stats["seconds"] >= stats["seconds_pruning"] > 0
        (line,) = re.findall(rf"prune stage {k} after step {step}: .*", out)
        assert line.endswith(f" ({stats['seconds']:.1f} s)"), line
    exchange_lines = [ln for ln in out.splitlines() if ln.startswith("exchange: ")]
    assert exchange_lines == [exchange_lines[0]] and exchange_lines[0].startswith(
        "exchange: dense records at world size 1"
    )
    step = yaml.safe_load((tmp_path / "cfg.yml").read_text())["step"]
    assert step["sparse_grad_comm"] is True
    assert step["packed"] is False and step["packed_auto"] is False  # a rerun of cfg.yml trains dense


def test_preset_picks_the_exchange_by_world_size_unless_told():
    """bytesplat: dense records at W = 1, packed at W > 1 (dense with gsplat's own pipeline, which
    has no packed exchange), one line saying which; --packed / --no_packed (either spelling) win
    at any world size; presets without packed_auto keep their value."""
    from splat_train.trainer.config import from_argv, resolve_packed

    cfg = from_argv(["bytesplat"])
    assert cfg.step.packed_auto
    one, line1 = resolve_packed(cfg, 1)
    two, line2 = resolve_packed(cfg, 2)
    assert (one.step.packed, two.step.packed, one.step.packed_auto, two.step.packed_auto) == (False, True, False, False)
    assert line1.startswith("exchange: dense records at world size 1") and "--packed overrides" in line1
    assert line2.startswith("exchange: packed records at world size 2") and "--no_packed overrides" in line2
    dist, _ = resolve_packed(
        from_argv(["bytesplat", "--raster", "unfused", "--pipeline", "gsplat-dist", "--no_sparse_grad_comm"]), 4
    )
    assert not dist.step.packed
    for flag, packed in (("--packed", True), ("--no_packed", False), ("--no-packed", False)):
        told = from_argv(["bytesplat", flag])
        assert not told.step.packed_auto and told.step.packed == packed
        for world_size in (1, 2):
            assert resolve_packed(told, world_size) == (told, None)
    default = from_argv(["default"])
    assert resolve_packed(default, 2) == (default, None) and not default.step.packed
    assert resolve_packed(from_argv(["default", "--packed_auto"]), 2)[0].step.packed  # the flag alone, any preset


def test_preset_trains_packed_records_at_two_ranks(tmp_path, capfd):
    from splat_train.trainer.cli import main

    out_dir = tmp_path / "run"
    flags = ["--max_steps", "2", "--nproc_per_node", "2", "--device", "cpu", "--result_dir", str(out_dir)]
    assert main(["bytesplat", *FLAGS, *flags]) == 0
    out = capfd.readouterr().out  # the spawned ranks write to the process's stdout
    assert [ln for ln in out.splitlines() if ln.startswith("exchange: ")] == [
        "exchange: packed records at world size 2 (--packed_auto: only visible records travel between ranks; "
        "--no_packed overrides it)"
    ]
    assert yaml.safe_load((out_dir / "cfg.yml").read_text())["step"]["packed"] is True


def test_config_stage_steps_scale_and_validate():
    from splat_train.trainer.cli import parse_args

    cfg = parse_args(["bytesplat", "--steps_scaler", "0.5"])
    assert (cfg.schedule.prune_stage2_step, cfg.schedule.prune_stage3_step) == (7500, 10000)
    assert cfg.step.sparse_grad_comm and cfg.schedule.prune_stage2_step >= cfg.schedule.refine_stop_iter
    with pytest.raises(ValueError, match="--prune_stage3_step"):
        parse_args(["bytesplat", "--prune_stage2_step", "100", "--prune_stage3_step", "50"])
    with pytest.raises(ValueError, match="--prune_fraction"):
        parse_args(["bytesplat", "--prune_fraction", "0"])


def test_tile_budget_without_triton_is_the_kernels_figure():
    """Where Triton is missing (a GPU torch built without it) pruning still targets the fused
    kernel's budget (an H200's 227 KiB -> 128), without importing the kernel module; a ROCm-like
    device (no opt-in field, 64 KiB) -> 32. Runs in a child process whose Triton import fails."""
    import subprocess
    import sys

    code = """
import sys
sys.modules["triton"] = None  # import triton -> ImportError
from types import SimpleNamespace
import torch
from splat_train.trainer import prune
props = {"h200": SimpleNamespace(shared_memory_per_block_optin=232448, shared_memory_per_block=49152),
         "rocm": SimpleNamespace(shared_memory_per_block=65536)}
for name, p in props.items():
    torch.cuda.get_device_properties = lambda dev, p=p: p
    print(name, prune.tile_budget(torch.device("cuda", 0)))
print("kernel_imported", "splat_train.kernels.fused_raster" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["h200", "128", "rocm", "32", "kernel_imported", "False"]


def test_tile_budget(monkeypatch):
    """--tile_budget wins; else the fused kernel's figure, also from ROCm-like device properties
    that have no ``shared_memory_per_block_optin``."""
    from types import SimpleNamespace

    from splat_train.kernels import budget

    cpu = torch.device("cpu")
    assert prune.tile_budget(cpu, override=7) == 7
    assert prune.tile_budget(cpu) == budget.CPU_TILE_BUDGET == 64
    rocm = SimpleNamespace(shared_memory_per_block=65536)  # MI300X: 64 KiB LDS, no opt-in field
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: rocm)
    assert prune.tile_budget(torch.device("cuda", 0)) == 32  # 65536 // 1060 = 61 -> 32
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(shared_memory_per_block=512))
    with pytest.raises(ValueError, match="--tile_budget"):
        prune.tile_budget(torch.device("cuda", 0))
