"""kernels/lazy_adam.py (the SH Adam deferred for unseen Gaussians, --lazy_sh_adam) against the
dense Adam: its tables and closed form against the step-by-step float64 iteration, and its kernels
(the flush, the projection forward's catch-up, kernels/adam.py's deferred rows) against
kernels.reference.adam_zero_grad_steps and against kernels/adam.py's dense update.

The kernels run under ``TRITON_INTERPRET=1`` in a child process (``python tests/test_lazy_adam.py
kernel IN OUT``); on a GPU (``-m gpu``) the same checks run directly, at a size that fills it."""

import contextlib
import dataclasses
import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from interpreted import interpreted_results

from splat_train.kernels import adam, constants, lazy_adam, projection
from splat_train.kernels.reference import adam_zero_grad_steps

# float32-representable betas and eps (batch size 2's): the kernels' float32 decays and the float64
# reference then use the same numbers
BETAS = (lazy_adam.float32(0.9**2), lazy_adam.float32(0.999**2))
EPS = lazy_adam.float32(1e-15 / math.sqrt(2))
LRS = (2.5e-3, 2.5e-3 / 20)  # sh0, shN
COUNT, MAX_COUNT = 900, 1000


@contextlib.contextmanager
def listed_programs(programs: int):
    """constants.LISTED_PROGRAMS set to ``programs`` (0: left as it is) inside the block."""
    default = constants.LISTED_PROGRAMS
    constants.LISTED_PROGRAMS = programs or default
    try:
        yield
    finally:
        constants.LISTED_PROGRAMS = default


def optimizers_for(sh0: torch.Tensor, shn: torch.Tensor, count: int, seed: int):
    """torch.optim.Adams of sh0 and shN at step ``count`` with random moments; rows 0-9 with m = 0,
    10-14 with v = 0 (and m != 0), 15-19 with v tiny (both out of the closed form's reach)."""
    gen = torch.Generator().manual_seed(seed)
    opts = {}
    for key, p, lr in (("sh0", sh0, LRS[0]), ("shN", shn, LRS[1])):
        leaf = torch.nn.Parameter(p)
        opt = torch.optim.Adam([{"params": [leaf], "lr": lr, "name": key}], betas=BETAS, eps=EPS)
        g = torch.randn(p.shape, generator=gen) * 10 ** (-6 * torch.rand(p.shape[0], 1, 1, generator=gen) - 1)
        m = 0.1 * g
        v = g * g * (1 + 50 * torch.rand(p.shape, generator=gen)) * 1e-3
        m[:10], v[10:15], v[15:20] = 0.0, 0.0, 1e-31
        opt.state[leaf] = dict(step=torch.tensor(float(count)), exp_avg=m.contiguous(), exp_avg_sq=v.contiguous())
        opts[key] = opt
    return opts


def make_problem(seed: int, N: int = 300, KR: int = 15, count: int = COUNT):
    """SH parameters, their Adams at ``count`` and each row's applied count: gaps of 0 (a quarter
    of the rows), 1, up to 600 (the fallback rows' at most 40: the interpreter steps them one by one)."""
    gen = torch.Generator().manual_seed(seed)
    sh0 = torch.randn(N, 1, 3, generator=gen)
    shn = torch.randn(N, KR, 3, generator=gen) * 0.3
    gaps = torch.randint(1, 601, (N,), generator=gen)
    gaps[20:30], gaps[30 : N // 4 + 30] = 1, 0
    gaps[10:20] = torch.randint(1, 41, (10,), generator=gen)
    applied = (count - gaps).int()
    return dict(sh0=sh0, shN=shn, applied=applied, seed=seed, count=count)


def state_of(problem):
    """(params dict, optimizers, LazyShAdam) of ``problem``, on the CPU."""
    opts = optimizers_for(problem["sh0"].clone(), problem["shN"].clone(), problem["count"], problem["seed"] + 1)
    params = {k: opts[k].param_groups[0]["params"][0] for k in lazy_adam.SH_KEYS}
    lazy = lazy_adam.LazyShAdam(opts, params["sh0"].shape[0], MAX_COUNT, "cpu")
    lazy.applied.copy_(problem["applied"])
    return params, opts, lazy


def reference(problem, rows=None):
    """Each row caught up by the dense iteration in float64 (``rows``: those only)."""
    params, opts, _ = state_of(problem)
    out = {}
    for k, lr in zip(lazy_adam.SH_KEYS, LRS):
        state = opts[k].state[params[k]]
        applied = problem["applied"].long()
        if rows is not None:
            applied = torch.where(rows, applied, problem["count"])
        p, m, v = adam_zero_grad_steps(
            params[k].detach().double(), state["exp_avg"].double(), state["exp_avg_sq"].double(), applied,
            problem["count"], lr, *BETAS, EPS,
        )  # fmt: skip
        out[k] = dict(param=p, exp_avg=m, exp_avg_sq=v)
    return out


def run_flush(problem, rows=None):
    params, opts, lazy = state_of(problem)
    lazy.flush(params, opts, rows)
    return dict(
        applied=lazy.applied.clone(),
        count=int(lazy.count),
        **{
            k: dict(
                param=params[k].detach().clone(),
                exp_avg=opts[k].state[params[k]]["exp_avg"].clone(),
                exp_avg_sq=opts[k].state[params[k]]["exp_avg_sq"].clone(),
            )
            for k in lazy_adam.SH_KEYS
        },
    )


def check_caught_up(got, want, problem, rows=None):
    """float32 results within float32 rounding of the float64 iteration; rows left alone equal
    their inputs bit for bit."""
    untouched = torch.zeros(problem["sh0"].shape[0], dtype=torch.bool)
    if rows is not None:
        untouched = ~rows
    for k in lazy_adam.SH_KEYS:
        before = dict(param=problem[k], **{n: None for n in ("exp_avg", "exp_avg_sq")})
        for name in ("param", "exp_avg", "exp_avg_sq"):
            out, ref = got[k][name], want[k][name]
            assert out.shape == ref.shape and torch.isfinite(out).all(), (k, name)
            if out.numel() == 0:
                continue
            scale = ref.abs().amax(dim=tuple(range(1, ref.dim())), keepdim=True).clamp_min(1e-30)
            err = ((out.double() - ref).abs() / scale).max()
            assert err < 2e-6, (k, name, float(err))
            if before[name] is not None and untouched.any():
                assert torch.equal(out[untouched], before[name][untouched]), (k, name)
    want_applied = torch.full_like(problem["applied"], problem["count"])
    if rows is not None:
        want_applied = torch.where(rows, want_applied, problem["applied"])
    assert torch.equal(got["applied"], want_applied)


def run_sequence(
    seed: int, device, N: int = 300, steps: int = 12, programs: int = 0, share: float = 0.3, every_step: int = 3
):
    """``steps`` Adam steps of sh0 / shN with random visibility (``share`` of the rows a step) and
    gradients on the visible rows only, densely (kernels/adam.py on every row) and deferred (the
    visible rows listed by lazy_adam.list_seen from random visibility bits and caught up,
    kernels/adam.py's lazy_rows, LazyShAdam.stepped; step 5 as a step that caught every row up and
    stepped them all), the deferred one flushed at the end; returns both runs' parameters and
    moments. ``programs``: the listed rows' grid (constants.LISTED_PROGRAMS) for this run;
    ``every_step``: a step that sees every row (its list is the whole tensor). A dense tensor
    ("means") steps beside them, its gradient rows of unseen Gaussians zero in the dense run and
    NaN in the deferred one, whose list carries the visibility bits (SeenRows.bits, as the
    projection's backward leaves those rows unwritten) by which the Adam reads them as zeros; its
    eps differs, so it steps in a launch of its own, without a deferred tensor."""
    gen = torch.Generator().manual_seed(seed)
    sh0, shn = torch.randn(N, 1, 3, generator=gen), torch.randn(N, 15, 3, generator=gen)
    visible = [torch.rand(N, generator=gen) < share for _ in range(steps)]
    visible[every_step][:] = True
    bits = [vis.int() * torch.randint(1, 1 << 20, (N,), generator=gen, dtype=torch.int32) for vis in visible]
    grads = [[torch.randn(p.shape, generator=gen) * 1e-3 * vis[:, None, None] for p in (sh0, shn)] for vis in visible]
    means = torch.randn(N, 3, generator=gen)
    means_grads = [torch.randn(N, 3, generator=gen) * 1e-3 * vis[:, None] for vis in visible]
    runs = {}
    with listed_programs(programs):
        for mode in ("dense", "lazy"):
            opts = {}
            for key, p, lr in (("sh0", sh0, LRS[0]), ("shN", shn, LRS[1]), ("means", means, 1e-3)):
                leaf = torch.nn.Parameter(p.clone().to(device))
                eps = EPS if key != "means" else 2 * EPS  # its own launch: one without a deferred tensor
                opts[key] = torch.optim.Adam([{"params": [leaf], "lr": lr, "name": key}], betas=BETAS, eps=eps)
            params = {k: opts[k].param_groups[0]["params"][0] for k in opts}
            lazy = lazy_adam.LazyShAdam(opts, N, 100, device) if mode == "lazy" else None
            for step, (vis, step_bits, step_grads) in enumerate(zip(visible, bits, grads)):
                vis = vis.to(device)
                for k, g in zip(lazy_adam.SH_KEYS, step_grads):
                    params[k].grad = g.to(device)
                params["means"].grad = means_grads[step].to(device)
                if lazy is None:
                    adam.adam_step(list(opts.values()))
                elif step == 5:  # the trainer's step through another projection: every row caught up first
                    lazy.flush(params, opts)
                    adam.adam_step(list(opts.values()))
                    lazy.stepped(opts, None)
                else:
                    lazy_adam.list_seen(step_bits.to(device), lazy.seen)  # the projection's list
                    shuffle(lazy.seen, seed + step)  # in any order, as a GPU's blocks append
                    lazy.seen.bits = step_bits.to(device)  # the unseen rows' gradients left unwritten:
                    params["means"].grad = torch.where(vis[:, None], params["means"].grad, float("nan"))
                    lazy.flush(params, opts, vis)  # what the projection's forward does for the rows it sees
                    adam.adam_step(list(opts.values()), lazy_rows=lazy.seen)
                    lazy.stepped(opts, lazy.seen)
                    lazy.seen.bits = None
            if lazy is not None:
                lazy.flush(params, opts)
            runs[mode] = {
                k: dict(
                    param=params[k].detach().cpu(),
                    exp_avg=opts[k].state[params[k]]["exp_avg"].cpu(),
                    exp_avg_sq=opts[k].state[params[k]]["exp_avg_sq"].cpu(),
                )
                for k in opts
            }
    return runs


def shuffle(seen: "lazy_adam.SeenRows", seed: int) -> None:
    """The listed rows in a random order (the interpreter's programs append in block order)."""
    n = int(seen.count)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(seen.rows.device)
    seen.rows[:n] = seen.rows[:n][perm]


def run_list_seen(seed: int, device="cpu", N: int = 3000):
    """lazy_adam.list_seen on random visibility bits (about 40% set) over three compaction blocks,
    with applied counts of which a third are at the count (the rest behind: waiting), then
    LazyShAdam.stepped's stamp of the listed rows, shuffled, by one program."""
    gen = torch.Generator().manual_seed(seed)
    bits = (torch.rand(N, generator=gen) < 0.4).int() * torch.randint(1, 1 << 30, (N,), generator=gen)
    behind = torch.randint(0, 3, (N,), generator=gen)  # 0: at the count
    before = (COUNT - behind).int()
    seen = lazy_adam.SeenRows.empty(N, device)
    seen.rows.fill_(-1)
    seen.waiting_rows.fill_(-1)
    count = torch.tensor([COUNT], dtype=torch.int32, device=device)
    lazy_adam.list_seen(bits.int().to(device), seen, before.to(device), count)
    waiting = dict(applied_before=before, waiting_rows=seen.waiting_rows.cpu(), waiting=int(seen.waiting))
    opts = optimizers_for(torch.zeros(N, 1, 3), torch.zeros(N, 15, 3), COUNT, seed)
    lazy = lazy_adam.LazyShAdam(opts, N, MAX_COUNT, device)
    lazy.applied.fill_(7)
    listed = seen.rows.clone()
    shuffle(seen, seed)
    with listed_programs(1):  # one program strides over the three blocks of the list
        lazy.stepped(opts, seen)
    seen = lazy_adam.SeenRows(listed, seen.count, seen.waiting_rows, seen.waiting)
    return dict(bits=bits, rows=seen.rows.cpu(), count=int(seen.count), applied=lazy.applied.cpu(), **waiting)


def check_list_seen(res):
    want = (res["bits"] != 0).nonzero().flatten()
    count, rows = res["count"], res["rows"]
    assert count == want.numel() and 0 < count < len(rows)
    assert torch.equal(rows[:count].long().sort().values, want)  # each seen row once, in any order
    assert bool((rows[count:] == -1).all())  # nothing written past the count
    assert torch.equal(res["applied"], torch.where(res["bits"] != 0, COUNT, 7).int())
    # the second list: the seen rows whose applied count was behind, each once
    want = ((res["bits"] != 0) & (res["applied_before"] < COUNT)).nonzero().flatten()
    waiting, rows = res["waiting"], res["waiting_rows"]
    assert waiting == want.numel() and 0 < waiting < count
    assert torch.equal(rows[:waiting].long().sort().values, want)
    assert bool((rows[waiting:] == -1).all())


def check_sequence(runs):
    for name in ("param", "exp_avg", "exp_avg_sq"):  # the dense tensor: the same kernel, the same zeros
        assert torch.equal(runs["dense"]["means"][name], runs["lazy"]["means"][name]), name
    for k in lazy_adam.SH_KEYS:
        for name in ("param", "exp_avg", "exp_avg_sq"):
            dense, lazy = runs["dense"][k][name].double(), runs["lazy"][k][name].double()
            scale = dense.abs().max()
            assert float((dense - lazy).abs().max()) <= 1e-6 * float(scale), (k, name)


def run_projection(seed: int, device="cpu", K: int = 16, programs: int = 0):
    """The projection forward with ``lazy``: a scene of test_projection_kernel's (``K`` SH bases)
    with the SH rows of four Gaussians in five behind by 1-300 counts, then the same forward
    without lazy on the SH rows the reference caught up (the seen ones); ``programs``: the catch-up's
    grid (0: its own; 1: one program striding over every tile of the list)."""
    from test_projection_kernel import FAR, NEAR, make_scene

    scene = make_scene(seed, 250, 2, K)
    degree = {1: 0, 4: 1, 9: 2, 16: 3}[K]
    params = {k: v.to(device).contiguous() for k, v in scene["params"].items()}
    cams = [scene[k].to(device) for k in ("viewmats", "Ks", "campos")]
    N = params["means"].shape[0]
    problem = dict(sh0=params["sh0"].cpu(), shN=params["shN"].cpu(), seed=seed, count=COUNT)
    problem["applied"] = (COUNT - torch.randint(1, 300, (N,), generator=torch.Generator().manual_seed(seed))).int()
    problem["applied"][::5] = COUNT  # stepped through the count: seen, not waiting
    sh_params, opts, lazy = state_of(problem)
    for k in lazy_adam.SH_KEYS:  # the shard's tensors, on the device
        state = opts[k].state[sh_params[k]]
        sh_params[k].data = sh_params[k].data.to(device)
        state["exp_avg"], state["exp_avg_sq"] = state["exp_avg"].to(device), state["exp_avg_sq"].to(device)
    lazy = lazy_adam.LazyShAdam(opts, N, MAX_COUNT, device)
    lazy.applied.copy_(problem["applied"])
    raw = dict(params, sh0=sh_params["sh0"].data, shN=sh_params["shN"].data)
    with listed_programs(programs):
        out = projection.project_and_shade_fused(raw, *cams, scene["width"], scene["height"], degree, NEAR, FAR,
                                                 lazy=lazy.rows(opts))  # fmt: skip
    seen = (out["radii"] > 0).any(-1).any(0).cpu()
    after = dict(
        sh0=raw["sh0"].cpu(),
        shN=raw["shN"].cpu(),
        applied=lazy.applied.cpu(),
        moments=[opts[k].state[sh_params[k]][n].cpu() for k in lazy_adam.SH_KEYS for n in ("exp_avg", "exp_avg_sq")],
    )
    want = reference(problem, seen)
    ref_raw = dict(params, sh0=want["sh0"]["param"].float().to(device), shN=want["shN"]["param"].float().to(device))
    plain = projection.project_and_shade_fused(ref_raw, *cams, scene["width"], scene["height"], degree, NEAR, FAR)
    return dict(
        problem=problem,
        seen=seen,
        listed=lazy.seen.mask(N).cpu(),
        waiting=int(lazy.seen.waiting),
        after=after,
        colors=out["colors"].cpu(),
        plain_colors=plain["colors"].cpu(),
        want={k: {n: v for n, v in d.items()} for k, d in want.items()},
    )


def check_projection(res):
    seen, problem, after = res["seen"], res["problem"], res["after"]
    assert seen.any() and not seen.all()
    assert torch.equal(res["listed"], seen)  # the forward listed the Gaussians with a radius in some camera
    behind = problem["applied"] < COUNT
    assert (seen & ~behind).any() and res["waiting"] == int((seen & behind).sum())  # those it caught up
    got = dict(applied=after["applied"], count=COUNT)
    names = ("exp_avg", "exp_avg_sq")
    for i, k in enumerate(lazy_adam.SH_KEYS):
        got[k] = dict(param=after[k], **{n: after["moments"][2 * i + j] for j, n in enumerate(names)})
    check_caught_up(got, res["want"], problem, seen)
    assert torch.allclose(res["colors"], res["plain_colors"], rtol=1e-5, atol=1e-6)


def run_backward(seed: int, device="cpu"):
    """The projection's backward into NaN-filled gradient buffers, plain and with ``seen_sh``
    (--lazy_sh_adam's), on a scene of test_projection_kernel's (one program's worth of
    Gaussians), with random gradients of every output."""
    from test_projection_kernel import FAR, NEAR, make_scene

    scene = make_scene(seed, 100, 2, 16)
    params = {k: v.to(device).contiguous() for k, v in scene["params"].items()}
    cams = [scene[k].to(device) for k in ("viewmats", "Ks", "campos")]
    setup = projection.Setup(scene["width"], scene["height"], 3, NEAR, FAR, False)
    out = projection.empty_outputs(100, 2, device)
    projection.forward_into(params, *cams, setup, out)
    gen = torch.Generator().manual_seed(seed)
    grads = {
        k: torch.randn(out[k].shape, generator=gen).to(device) for k in ("means2d", "conics", "opacities", "colors")
    }
    res = dict(bits=out["bits"].cpu())
    listed = adam.SeenRows.empty(100, device)
    lazy_adam.list_seen(out["bits"], listed)
    shuffle(listed, seed)
    for name, seen_sh, rows, zeros in (("plain", False, None, True), ("seen_sh", True, None, True),
                                       ("listed", True, listed, True), ("unwritten", True, listed, False)):  # fmt: skip
        got = {k: torch.full_like(params[k], float("nan")) for k in projection.PARAM_KEYS}
        projection.backward_into(params, *cams, out["bits"], setup, grads, got, seen_sh=seen_sh, listed=rows,
                                 unseen_zeros=zeros)  # fmt: skip
        res[name] = {k: v.cpu() for k, v in got.items()}
    res["handed_bits"] = None if listed.bits is None else listed.bits.cpu()
    return res


def check_backward(res):
    """Plain: every row written. seen_sh: the rows of the Gaussians seen as the plain backward's,
    bit for bit; the sh0 / shN rows of the others unwritten (still NaN), their geometry zero. Over
    the forward's list (shuffled): what seen_sh writes; without the unseen zeros the others'
    geometry unwritten too, and the bits handed to the Adam."""
    seen = res["bits"] != 0
    assert seen.any() and not seen.all()
    assert torch.equal(res["handed_bits"], res["bits"])
    for k, plain in res["plain"].items():
        got = res["seen_sh"][k]
        assert not plain.isnan().any(), k
        assert torch.equal(got[seen], plain[seen]), k
        if k in lazy_adam.SH_KEYS:
            assert got[~seen].isnan().all(), k
        else:
            assert torch.equal(got[~seen], torch.zeros_like(got[~seen])), k
        torch.testing.assert_close(res["listed"][k], got, rtol=0, atol=0, equal_nan=True, msg=k)
        bare = res["unwritten"][k]
        assert torch.equal(bare[seen], plain[seen]) and bare[~seen].isnan().all(), k


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return interpreted_results(__file__, tmp_path_factory, "lazy", lazy_adam.available())


def test_tables_give_the_sums_of_the_dense_updates():
    """H1, H2 and the powers against their sums over 600 terms, computed directly."""
    b1, b2 = BETAS
    tab = lazy_adam.make_tables(b1, b2, 400)
    rho1, rho2 = b1 / math.sqrt(b2), b1 / b2
    for t0, k in ((0, 1), (3, 7), (150, 250), (399, 1)):
        u = np.arange(t0 + 1, t0 + k + 1, dtype=np.float64)
        s = np.arange(1, k + 1, dtype=np.float64)
        w1 = np.sqrt(1 - b2**u) / (1 - b1**u)
        w2 = (1 - b2**u) / (1 - b1**u)
        s1 = tab[0, t0] - tab[2, k] * tab[0, t0 + k]
        s2 = tab[1, t0] - tab[3, k] * tab[1, t0 + k]
        assert s1 == pytest.approx(float((rho1**s * w1).sum()), rel=1e-12)
        assert s2 == pytest.approx(float((rho2**s * w2).sum()), rel=1e-12)
        assert tab[4, k] == pytest.approx(b1**k, rel=1e-12) and tab[5, k] == pytest.approx(b2**k, rel=1e-12)


def test_closed_form_equals_the_step_by_step_iteration_in_float64():
    """The module docstring's formula for the zero-gradient steps, in float64, against
    reference.adam_zero_grad_steps: the same numbers to 1e-10 of the update where it applies."""
    tab = lazy_adam.make_tables(*BETAS, 2000)
    gen = torch.Generator().manual_seed(3)
    n = 400
    m = torch.randn(n, generator=gen, dtype=torch.float64) * 10 ** (-6 * torch.rand(n, generator=gen) - 1)
    v = m * m * (1 + 50 * torch.rand(n, generator=gen, dtype=torch.float64)) * 10
    p = torch.randn(n, generator=gen, dtype=torch.float64)
    applied = torch.randint(0, 1500, (n,), generator=gen)
    count = 1900
    want_p, want_m, want_v = adam_zero_grad_steps(p, m, v, applied, count, LRS[0], *BETAS, EPS)
    k = count - applied
    s1 = torch.from_numpy(tab[0])[applied] - torch.from_numpy(tab[2])[k] * torch.from_numpy(tab[0])[count]
    s2 = torch.from_numpy(tab[1])[applied] - torch.from_numpy(tab[3])[k] * torch.from_numpy(tab[1])[count]
    b2k = torch.from_numpy(tab[5])[k]
    ok = lazy_adam.closed_form_applies(m, v, b2k, EPS)
    assert ok.all()
    got_p = p - LRS[0] * (m / v.sqrt()) * s1 + LRS[0] * (EPS * m / v) * s2
    assert torch.allclose(got_p - p, want_p - p, rtol=1e-10, atol=1e-18)
    assert torch.allclose(m * torch.from_numpy(tab[4])[k], want_m, rtol=1e-12, atol=0)
    assert torch.allclose(v * b2k, want_v, rtol=1e-12, atol=0)
    # where eps is not negligible beside sqrt(v_k), the closed form must not be taken
    assert not lazy_adam.closed_form_applies(m[:1], torch.full((1,), 1e-40, dtype=torch.float64), 1.0, EPS).any()


def test_check_rejects_a_missed_step():
    """check_caught_up fails on rows caught up one count short."""
    problem = make_problem(5, N=80, KR=3)
    want = reference(problem)
    short = dict(
        problem, count=problem["count"] - 1, applied=torch.minimum(problem["applied"], torch.tensor(COUNT - 1))
    )
    got = reference(short)
    got = {k: {n: t.float() for n, t in d.items()} for k, d in got.items()}
    got["applied"] = torch.full_like(problem["applied"], COUNT)
    got["count"] = COUNT
    with pytest.raises(AssertionError):
        check_caught_up(got, want, problem)


def test_flush_kernel_matches_reference_under_the_interpreter(interpreted):
    problem = interpreted["problem"]
    check_caught_up(interpreted["flush"], reference(problem), problem)


def test_flush_of_some_rows_leaves_the_others_under_the_interpreter(interpreted):
    problem, rows = interpreted["problem"], interpreted["rows"]
    check_caught_up(interpreted["flush_rows"], reference(problem, rows), problem, rows)


def test_no_shn_rows_under_the_interpreter(interpreted):
    """SH degree 0 (shN with no bases): sh0 alone."""
    problem = interpreted["problem_k0"]
    check_caught_up(interpreted["flush_k0"], reference(problem), problem)


def test_deferred_steps_equal_the_dense_adam_under_the_interpreter(interpreted):
    check_sequence(interpreted["sequence"])


def test_deferred_steps_with_programs_striding_over_the_list_under_the_interpreter(interpreted):
    """One program per deferred tensor: it takes every block of the listed rows (about 108 of 120
    shN rows, 5 blocks of 1,024 floats), the list shuffled as a GPU's atomics leave it."""
    check_sequence(interpreted["sequence_strided"])


def test_list_of_seen_rows_and_their_stamp_under_the_interpreter(interpreted):
    check_list_seen(interpreted["list_seen"])


def test_check_list_seen_rejects_a_lost_row():
    """check_list_seen on made-up output: a row missing, listed twice, or not stamped fails it."""
    bits = torch.tensor([0, 5, 0, 9], dtype=torch.int32)
    good = dict(bits=bits, rows=torch.tensor([3, 1, -1, -1], dtype=torch.int32), count=2,
                applied=torch.tensor([7, COUNT, 7, COUNT], dtype=torch.int32),
                applied_before=torch.tensor([0, COUNT - 1, 0, COUNT], dtype=torch.int32),
                waiting_rows=torch.tensor([1, -1, -1, -1], dtype=torch.int32), waiting=1)  # fmt: skip
    check_list_seen(good)
    for bad in (dict(count=1), dict(rows=torch.tensor([3, 3, -1, -1], dtype=torch.int32)),
                dict(applied=torch.tensor([7, COUNT, 7, 7], dtype=torch.int32)),
                dict(waiting_rows=torch.tensor([3, -1, -1, -1], dtype=torch.int32)), dict(waiting=2)):  # fmt: skip
        with pytest.raises(AssertionError):
            check_list_seen(dict(good, **bad))


def test_backward_leaves_the_unseen_sh_rows_unwritten_under_the_interpreter(interpreted):
    check_backward(interpreted["backward"])


def test_backward_refuses_to_leave_rows_unwritten_where_it_takes_adam():
    with pytest.raises(ValueError, match="seen_sh"):
        projection.backward_into({"means": torch.zeros(1, 3)}, None, None, None, None, None, {}, {}, object(), True)


def test_projection_forward_catches_up_the_rows_it_sees_under_the_interpreter(interpreted):
    check_projection(interpreted["projection"])


def test_one_program_catches_up_every_tile_at_sh_degree_1_under_the_interpreter(interpreted):
    """Rows of 3 + 9 coefficients (16 lanes each, 32 rows a tile), one program striding over the tiles."""
    check_projection(interpreted["projection_k4"])


def test_counts_past_the_tables_extend_them():
    """A checkpoint from a run longer than --max_steps: the tables are made again to reach its
    count (no refusal), every row at that count."""
    problem = make_problem(6, N=20, KR=1)
    params, opts, lazy = state_of(problem)
    for k in lazy_adam.SH_KEYS:
        opts[k].state[params[k]]["step"] = torch.tensor(float(MAX_COUNT + 5))
    lazy.reset(opts, 20)
    rows = lazy_adam.TABLE_ROWS + len(lazy_adam.STEP_ROWS)
    assert lazy.max_count >= MAX_COUNT + 5 and lazy.tables.shape == (rows, lazy.max_count + 1)
    want = lazy_adam.make_tables(*BETAS, lazy.max_count)
    assert np.array_equal(lazy.tables[: lazy_adam.TABLE_ROWS].numpy(), want)
    check_step_rows(lazy, LRS)
    assert bool((lazy.applied == MAX_COUNT + 5).all()) and int(lazy.count) == MAX_COUNT + 5


def check_step_rows(lazy, lrs):
    """The tables' step-size rows: the float32 step size the dense Adam's host code gives count u
    (adam.step_constants), for each SH learning rate."""
    for row, lr in zip(lazy_adam.STEP_ROWS, lrs):
        want = [
            adam.step_constants(dict(lr=lr, betas=BETAS), dict(step=u - 1))[0] for u in range(1, lazy.max_count + 1)
        ]
        assert np.array_equal(lazy.tables[row, 1:].numpy(), np.array(want, np.float32).astype(np.float64)), row


def test_a_changed_learning_rate_rewrites_the_step_sizes(monkeypatch):
    """check_lrs: every row caught up at the old rates first (the flush), then the step sizes the
    fallback reads are the new rates' (in place: a captured graph reads the same storage)."""
    problem = make_problem(6, N=20, KR=1)
    params, opts, lazy = state_of(problem)
    flushed = []
    monkeypatch.setattr(lazy, "flush", lambda p, o: flushed.append(lazy.tables[lazy_adam.STEP_ROWS[1], 5].item()))
    storage = lazy.tables.data_ptr()
    lazy.check_lrs(params, opts)
    assert flushed == []  # unchanged rates: nothing to do
    opts["shN"].param_groups[0]["lr"] = LRS[1] / 4
    lazy.check_lrs(params, opts)
    assert flushed == [pytest.approx(LRS[1] / (1 - BETAS[0] ** 5), rel=1e-6)]  # the old rate's, at the flush
    check_step_rows(lazy, (LRS[0], LRS[1] / 4))
    assert lazy.tables.data_ptr() == storage and lazy.lrs == [LRS[0], LRS[1] / 4]


def test_deferred_rows_need_the_sh_groups_by_name():
    """kernels/adam.py finds sh0 / shN by their groups' names: without them the deferred rows would
    step densely too (and be caught up again), so the launch refuses."""
    p = torch.nn.Parameter(torch.zeros(4, 1, 3))
    p.grad = torch.ones(4, 1, 3)
    opt = torch.optim.Adam([p], lr=0.1)  # no "name"
    with pytest.raises(ValueError, match="lazy_rows names"):
        adam.adam_step([opt], lazy_rows=lazy_adam.SeenRows.from_mask(torch.ones(4, dtype=torch.bool)))


def test_a_head_without_the_triton_projection_refuses_the_deferred_rows():
    """Its forward would list no rows, and the step's Adam would read the last step's list."""
    from splat_train.trainer.step.capture import head_function

    with pytest.raises(ValueError, match="needs the Triton projection"):
        head_function(None, [(8, 8)], 0, 0.01, 100.0, "pinhole", False, "gsplat", None, object())


def test_the_first_capture_with_the_deferred_rows_warms_up():
    """A deferral started mid-run (ForwardBackward.defer_sh_adam) brings kernels the head never
    launched (the list, the catch-up, the backward leaving rows unwritten): their first capture
    warms up eagerly first, as a new image size's does; a new parameter storage alone does not."""
    from splat_train.kernels import reference as ref_ops
    from splat_train.trainer.render import camera_centres
    from splat_train.trainer.step.capture import GraphedHead

    from test_graphs import _cams, _raw_params

    flags = []

    class Recording(GraphedHead):
        def _capture(self, fn, tensors, cams, warm_up=True):
            flags.append(warm_up)
            return lambda *inputs: None

    head = Recording(ref_ops, 0.01, 1e10, projection="triton")
    cams = _cams()
    args = (cams.viewmats, cams.Ks, camera_centres(cams.viewmats), [(cams.width, cams.height)] * 2, 1)
    params = _raw_params(n=20)
    head.prepare(params, *args)
    head.prepare({k: v.detach().clone() for k, v in params.items()}, *args)  # densified: new storage
    head.lazy_rows = lambda: SimpleNamespace(key=lambda: (7,))
    head.prepare(params, *args)
    assert flags == [True, False, True]


def test_adam_mask_and_selective_exclude_each_other():
    p = torch.nn.Parameter(torch.zeros(4, 3))
    p.grad = torch.ones(4, 3)
    opt = torch.optim.Adam([{"params": [p], "lr": 0.1, "name": "sh0"}])
    rows = torch.ones(4, dtype=torch.bool)
    with pytest.raises(ValueError, match="exclude each other"):
        adam.adam_step([opt], visible=rows, lazy_rows=lazy_adam.SeenRows.from_mask(rows))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not lazy_adam.available(), reason="needs Triton")
def test_gpu_kernels_match_the_reference():
    problem = make_problem(11, N=20_000)
    params, opts, lazy = state_of(problem)
    for k in lazy_adam.SH_KEYS:
        state = opts[k].state[params[k]]
        params[k].data = params[k].data.cuda()
        state["exp_avg"], state["exp_avg_sq"] = state["exp_avg"].cuda(), state["exp_avg_sq"].cuda()
    lazy = lazy_adam.LazyShAdam(opts, params["sh0"].shape[0], MAX_COUNT, "cuda")
    lazy.applied.copy_(problem["applied"])
    lazy.flush(params, opts)
    got = dict(applied=lazy.applied.cpu(), count=int(lazy.count))
    for k in lazy_adam.SH_KEYS:
        state = opts[k].state[params[k]]
        got[k] = dict(
            param=params[k].detach().cpu(), exp_avg=state["exp_avg"].cpu(), exp_avg_sq=state["exp_avg_sq"].cpu()
        )
    check_caught_up(got, reference(problem), problem)
    check_sequence(run_sequence(12, "cuda", N=200_000, steps=20))
    check_sequence(run_sequence(14, "cuda", N=200_000, steps=6, programs=3))
    check_list_seen(run_list_seen(15, "cuda", N=1_000_000))
    check_projection(run_projection(13, "cuda"))
    check_backward(run_backward(17, "cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not lazy_adam.available(), reason="needs Triton")
def test_gpu_a_deferral_started_mid_run_captures_its_head():
    """The graphed head of a run whose deferral starts mid-run (auto, once the shard is large):
    its next capture, the first launch of the list, catch-up and SEEN_SH kernels, succeeds (no
    capture falls back to the eager head) and lists the Gaussians the head sees."""
    from splat_train.trainer.step.capture import GraphedHead

    gen = torch.Generator().manual_seed(0)
    N = 20_000
    raw = dict(means=torch.randn(N, 3, generator=gen), quats=torch.randn(N, 4, generator=gen),
               scales=torch.full((N, 3), -3.0), opacities=torch.zeros(N), sh0=torch.randn(N, 1, 3, generator=gen) * 0.1,
               shN=torch.zeros(N, 15, 3))  # fmt: skip
    params = {k: torch.nn.Parameter(v.cuda()) for k, v in raw.items()}
    opts = {k: torch.optim.Adam([{"params": [p], "lr": 1e-3, "name": k}], eps=1e-15) for k, p in params.items()}
    for p in params.values():  # one step: the moments exist
        p.grad = torch.zeros_like(p)
    adam.adam_step(list(opts.values()))
    viewmats = torch.eye(4, device="cuda")[None].clone()
    viewmats[0, 2, 3] = 8.0
    Ks = torch.tensor([[[100.0, 0, 64], [0, 100.0, 48], [0, 0, 1]]], device="cuda")
    campos = torch.tensor([[0.0, 0, -8.0]], device="cuda")
    warnings = []
    head = GraphedHead(None, 0.01, 1e10, projection="triton", warn=warnings.append)

    def step():
        out = head(params, viewmats, Ks, campos, [(128, 96)], 3)
        torch.autograd.backward([out["means2d"], out["colors"]], [torch.ones_like(out["means2d"]),
                                                                  torch.ones_like(out["colors"])])  # fmt: skip
        for p in params.values():
            p.grad = None
        torch.cuda.synchronize()
        return out

    step(), step()
    lazy = lazy_adam.LazyShAdam(opts, N, 100, "cuda")
    head.lazy_rows = lambda: lazy.rows(opts)
    out = step()
    out = step()
    assert head.failures == 0 and head.captures == 2, (head.captures, head.failures, warnings)
    seen = (out["radii"] > 0).any(-1).any(0)
    assert 0 < int(lazy.seen.count) < N and torch.equal(lazy.seen.mask(N), seen)


class RecordingLazy:
    """Stands in for LazyShAdam in the shard's wiring tests: records flushes and resets."""

    def __init__(self, n):
        self.applied = torch.zeros(n, dtype=torch.int32)
        self.calls = []

    def flush(self, params, optimizers, rows=None):
        self.calls.append(("flush", int(params["means"].shape[0])))

    def reset(self, optimizers, num):
        self.calls.append(("reset", num))
        self.applied = torch.zeros(num, dtype=torch.int32)


def _cpu_shard(n=50):
    from splat_train.trainer.shard import GaussianShard

    gen = torch.Generator().manual_seed(0)
    shapes = dict(means=(n, 3), scales=(n, 3), quats=(n, 4), opacities=(n,), sh0=(n, 1, 3), shN=(n, 15, 3))
    params = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.randn(s, generator=gen)) for k, s in shapes.items()})
    opts = {k: torch.optim.Adam([{"params": [params[k]], "lr": 1e-3, "name": k}]) for k in params}
    shard = GaussianShard(params, opts, None, None, {"grad2d": None, "count": None, "radii": None})
    shard.lazy = RecordingLazy(n)
    return shard


def test_the_shard_catches_up_before_every_read_and_cut():
    """activated, remove and export flush first; a cut or a replaced parameter set resets the rows
    (state_dict is GaussianShard's too, flushed the same way: checked with its scheduler absent)."""
    shard = _cpu_shard()
    shard.activated()
    assert shard.lazy.calls == [("flush", 50)]
    mask = torch.zeros(50, dtype=torch.bool)
    mask[:7] = True
    assert shard.remove(mask) == 7
    assert shard.lazy.calls[1:] == [("flush", 50), ("reset", 43)]
    shard.params = torch.nn.ParameterDict({k: torch.nn.Parameter(v.detach()[:5]) for k, v in shard.params.items()})
    shard.sync()  # rows replaced wholesale: taken as current, not flushed with 43 rows recorded
    assert shard.lazy.calls[-1] == ("reset", 5)
    with pytest.raises(AttributeError):  # no scheduler here; the flush came before it was read
        shard.state_dict()
    assert shard.lazy.calls[-1] == ("flush", 5)


def test_plan_defers_the_sh_adam_where_it_applies():
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.step.plan import lazy_adam_mode

    cfg = from_argv(["default"])
    if lazy_adam.available():
        assert lazy_adam_mode(cfg, "triton", False, False, 3_000_000) == (
            True,
            "--lazy_sh_adam auto: 3,000,000 Gaussians in the shard",
        )
        assert lazy_adam_mode(cfg, "triton", False, False, 1000) == (
            False,
            "--lazy_sh_adam auto: 1,000 Gaussians, under 2,000,000",
        )
        on = from_argv(["default", "--lazy_sh_adam", "on"])
        assert lazy_adam_mode(on, "triton", False, False, 10) == (True, "--lazy_sh_adam on")
    assert lazy_adam_mode(cfg, "gsplat", False, False, 3_000_000)[0] is False
    assert lazy_adam_mode(cfg, "triton", True, False) == (
        False,
        "--lazy_sh_adam auto: Adam in the projection's backward (--fused_adam)",
    )
    assert lazy_adam_mode(cfg, "triton", False, True)[0] is False
    assert lazy_adam_mode(from_argv(["default", "--lazy_sh_adam", "off"]), "triton", False, False) == (
        False,
        "--lazy_sh_adam off",
    )
    with pytest.raises(ValueError, match="--lazy_sh_adam on cannot run"):
        lazy_adam_mode(from_argv(["default", "--lazy_sh_adam", "on"]), "gsplat", False, False)


def test_plan_defers_only_where_a_step_sees_little_of_the_shard():
    """auto with a large shard: on at or under LAZY_MAX_SEEN_SHARE of it seen per step (or with no
    estimate), off over it with the share in the reason; on and off are not asked."""
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.step.plan import LAZY_MAX_SEEN_SHARE, lazy_adam_mode

    cfg = from_argv(["default"])
    on, why = lazy_adam_mode(cfg, "triton", False, False, 3_000_000, LAZY_MAX_SEEN_SHARE)
    assert on and "3,000,000 Gaussians in the shard, a step sees about 10.0%" in why
    assert lazy_adam_mode(cfg, "triton", False, False, 3_000_000, None) == (
        True,
        "--lazy_sh_adam auto: 3,000,000 Gaussians in the shard",
    )
    off, why = lazy_adam_mode(cfg, "triton", False, False, 3_000_000, 0.97)
    assert not off and why.startswith("--lazy_sh_adam auto: a step sees about 97.0%") and why.endswith("over 10%")
    assert lazy_adam_mode(cfg, "triton", False, False, 1000, 0.01)[0] is False  # the size first
    assert lazy_adam_mode(from_argv(["default", "--lazy_sh_adam", "on"]), "triton", False, False, 3_000_000, 1.0)[0]


def test_step_line_says_why_the_sh_adam_stays_dense(monkeypatch):
    """Where the share a step sees decided against the deferral, the plan's console line says so
    (and with it deferred, why); where it was not asked, the line says nothing of the SH Adam."""
    from splat_train.kernels import projection
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.step.plan import plan_step

    monkeypatch.setattr(projection, "available", lambda: True)
    monkeypatch.setattr(lazy_adam, "available", lambda: True)
    cfg = from_argv(["default"])
    dense = plan_step(cfg, "cuda", 1, masked=False, num_gaussians=3_000_000, seen_share=0.97).describe()
    assert "the SH Adam dense (--lazy_sh_adam auto: a step sees about 97.0%" in dense
    lazy = plan_step(cfg, "cuda", 1, masked=False, num_gaussians=3_000_000, seen_share=0.03).describe()
    assert "the SH Adam of unseen Gaussians deferred (--lazy_sh_adam auto: 3,000,000 Gaussians" in lazy
    assert "about 3.0%" in lazy
    small = plan_step(cfg, "cuda", 1, masked=False, num_gaussians=1000).describe()
    assert "SH Adam" not in small


def test_step_seen_share_equals_counting_the_frusta():
    """step_seen_share against a direct count: points on a line along the z axis in front of and
    behind cameras, seen by a known subset; a step of W ranks, each drawing B distinct cameras,
    misses a point where every rank's B-subset of the cameras misses it (enumerated here); the far
    plane and the image bounds cut."""
    import itertools

    from splat_train.trainer.step.plan import step_seen_share

    # 4 cameras at the origin looking down +z (identity world-to-camera), 100x100 pixels
    V = 4
    viewmats = torch.eye(4).repeat(V, 1, 1)
    viewmats[1, 0, 3] = 1000.0  # camera 1 shifted: every point projects far outside its image
    Ks = torch.tensor([[50.0, 0, 50], [0, 50, 50], [0, 0, 1]]).repeat(V, 1, 1)
    sizes = torch.tensor([[100, 100]] * V)
    means = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 5.0], [0.0, 0.0, -1.0], [0.0, 0.0, 50.0], [3.0, 0.0, 1.0]])
    # points 0 and 1: seen by cameras 0, 2, 3; point 2 behind them; point 3 beyond far = 10; point
    # 4 off the image (u = 50 + 150)
    seen_by = [{0, 2, 3}, {0, 2, 3}, set(), set(), set()]
    for B, W in ((1, 1), (1, 2), (2, 1), (3, 2), (9, 1)):
        subsets = list(itertools.combinations(range(V), min(B, V)))
        miss = [sum(not (cams & set(sub)) for sub in subsets) / len(subsets) for cams in seen_by]
        want = sum(1 - m**W for m in miss) / len(seen_by)
        got = step_seen_share(means, viewmats, Ks, sizes, 0.01, 10.0, B, W, chunk=3)
        assert abs(got - want) < 1e-6, (B, W, got, want)
    assert step_seen_share(means, viewmats, Ks, sizes, 0.01, 10.0, 1) == pytest.approx(0.3)
    assert step_seen_share(means[:0], viewmats, Ks, sizes, 0.01, 10.0, 1) == 0.0
    # a sample of 2 of the 5 at an even stride: points 0 and 2
    got = step_seen_share(means, viewmats, Ks, sizes, 0.01, 10.0, 1, sample=2)
    assert abs(got - (3 / 4 + 0.0) / 2) < 1e-6
    with pytest.raises(ValueError, match="batch_size >= 1"):
        step_seen_share(means, viewmats, Ks, sizes, 0.01, 10.0, 0)
    with pytest.raises(ValueError, match="world_size >= 1"):
        step_seen_share(means, viewmats, Ks, sizes, 0.01, 10.0, 1, 0)


def test_trainer_estimates_what_a_step_sees(monkeypatch, capsys):
    """The trainer asks for the share only where auto and the size ask it; the city's cameras see
    little of it, the orbit's most, and the step line says why the deferral is off."""
    from splat_train.trainer import loop
    from splat_train.trainer.step.plan import LAZY_MAX_SEEN_SHARE

    from test_gsplat_flags import trainer

    t = trainer("--max_steps", "3")
    orbit = t.seen_share(t.shard.params["means"])
    city = trainer(
        "--synthetic_layout", "city", "--synthetic_num_gaussians", "3000", "--synthetic_num_cameras", "12",
        "--synthetic_image_size", "64", "--synthetic_image_height", "36", "--max_steps", "3",
    )  # fmt: skip
    share = city.seen_share(city.shard.params["means"])
    assert 0 < share <= LAZY_MAX_SEEN_SHARE < orbit, (share, orbit)
    monkeypatch.setattr(loop, "LAZY_MIN_GAUSSIANS", 1)
    assert t._lazy_auto_sized(10) and not t._lazy_auto_sized(0)
    t.cfg = dataclasses.replace(t.cfg, step=dataclasses.replace(t.cfg.step, lazy_sh_adam="off"))
    assert not t._lazy_auto_sized(10)


def test_a_loss_term_on_the_parameters_keeps_the_unseen_rows_zeros():
    """--opacity_reg / --scale_reg give every Gaussian a gradient outside the projection: the
    deferral's backward then writes the unseen Gaussians' geometric zeros for them to add to
    (LazyRows.unseen_zeros); without such a term it leaves them for the Adam to read by bits."""
    from test_gsplat_flags import trainer

    for flags, zeros in (((), False), (("--opacity_reg", "0.01"), True), (("--scale_reg", "0.01"), True)):
        t = trainer("--max_steps", "3", *flags)
        t._defer_sh_adam()
        assert t.shard.lazy.rows(t.optimizers).unseen_zeros == zeros, flags


def test_plan_leaves_auto_to_start_once_the_shard_is_large(monkeypatch):
    """auto under the threshold: off now, to start once the shard holds LAZY_MIN_GAUSSIANS
    (densification, a resumed checkpoint); not where the step cannot take it or the flag says."""
    from splat_train.kernels import projection
    from splat_train.trainer.config import from_argv
    from splat_train.trainer.step.plan import plan_step

    monkeypatch.setattr(projection, "available", lambda: True)
    monkeypatch.setattr(lazy_adam, "available", lambda: True)

    def planned(*flags, n=1000, device="cuda"):
        p = plan_step(from_argv(["default", *flags]), device, 1, masked=False, num_gaussians=n)
        return p.lazy_sh_adam, p.lazy_sh_adam_later

    assert planned() == (False, True)
    assert planned(n=3_000_000) == (True, False)
    assert planned("--lazy_sh_adam", "off") == (False, False)
    assert planned("--lazy_sh_adam", "on") == (True, False)
    assert planned("--fused_adam", "on") == (False, False)
    assert planned("--visible_adam") == (False, False)
    assert planned(device="cpu") == (False, False)  # the gsplat projection


def test_a_resumed_checkpoint_large_enough_starts_the_deferral(monkeypatch, capsys):
    """--resume (resume.resume_from) with auto left for later (a shard that started small) and the
    checkpoint at the threshold: the deferral starts where a step sees at most LAZY_MAX_SEEN_SHARE
    of the shard (not on the orbit scene, whose cameras see most of it, until the share allows
    it), the plan and the console say so; loading alone (--ckpt's evaluation) does not start it."""
    from pathlib import Path

    from splat_train.trainer import loop, resume

    from test_gsplat_flags import trainer

    t = trainer("--max_steps", "3")
    state = dict(t.state_dict(), step=0)  # as save_checkpoint writes it
    t.plan = dataclasses.replace(t.plan, lazy_sh_adam_later=True)
    monkeypatch.setattr(resume.checkpoint, "latest_complete", lambda folder: (0, [Path("shard.pt")]))
    monkeypatch.setattr(resume.checkpoint, "load_shard", lambda files, rank, world_size: state)
    monkeypatch.setattr(loop, "LAZY_MIN_GAUSSIANS", t.shard.num + 1)
    resume.resume_from(t, Path("ckpts"))
    assert t.shard.lazy is None and not t.plan.lazy_sh_adam  # one short of the threshold
    monkeypatch.setattr(loop, "LAZY_MIN_GAUSSIANS", t.shard.num)
    t.load_state_dict(state)
    assert t.shard.lazy is None  # loading alone
    resume.resume_from(t, Path("ckpts"))
    assert t.shard.lazy is None and t.plan.lazy_sh_adam_later  # the orbit's cameras see most of it
    monkeypatch.setattr(loop, "LAZY_MAX_SEEN_SHARE", 1.0)
    resume.resume_from(t, Path("ckpts"))
    assert t.plan.lazy_sh_adam and not t.plan.lazy_sh_adam_later and t.shard.lazy is not None
    assert t.forward_backward.lazy_rows is not None and t.forward_backward.lazy_sync is not None
    assert f"{t.shard.num:,} Gaussians in the shard after step 0" in capsys.readouterr().out


def test_cpu_run_says_the_sh_adam_steps_densely(tmp_path, capsys):
    """A CPU run takes the gsplat projection: --lazy_sh_adam auto is off there, and on is refused
    with one line naming the flag."""
    from splat_train.trainer.cli import main

    assert main(["default", "--max_steps", "2", "--result_dir", str(tmp_path / "a"), "--num_traj_frames", "0"]) == 0
    step = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step:")]
    assert step and "deferred" not in step[0]
    rc = main(["default", "--max_steps", "2", "--result_dir", str(tmp_path / "b"), "--lazy_sh_adam", "on"])
    assert rc != 0
    assert "--lazy_sh_adam on cannot run" in capsys.readouterr().err


def _city_trainer(tmp_path, mode, extra=()):
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.launch import DistContext
    from splat_train.trainer.loop import Trainer

    cfg = parse_args(
        ["default", "--synthetic_layout", "city", "--synthetic_num_gaussians", "60000", "--synthetic_num_cameras", "24",
         "--synthetic_image_size", "320", "--synthetic_image_height", "180", "--max_steps", "300", "--sh_degree_interval", "10",
         "--result_dir", str(tmp_path / mode), "--lazy_sh_adam", mode, *extra]
    )  # fmt: skip
    return Trainer(cfg, DistContext(device=torch.device("cuda")), build_scene(cfg))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not lazy_adam.available(), reason="needs Triton")
@pytest.mark.parametrize(
    "extra", [pytest.param([], id="whole_step_graphs"), pytest.param(["--cuda_graphs", "off"], id="eager")]
)
def test_gpu_training_with_the_deferred_sh_adam_equals_the_dense_one(tmp_path, extra):
    """The city scene (a camera sees a few percent of it), 60 steps with the SH Adam deferred and
    dense, and dense once more (the control: the kernels' atomics sum in another order each run):
    during the deferred run most rows wait; after it every row is caught up, and its parameters and
    moments differ from the dense run's by at most 10x what the control's do (+ 1e-4, relative;
    second moments: or 3e-3). The catch-up rounds once where the dense Adam rounds each step, and
    60 steps enlarge both kinds of difference: measured up to 11.5x a control of 1.2e-4 (1.4e-3),
    in the means' second moments, whose values span 1e-23 to 1e-11."""
    runs = {}
    for name, mode in (("on", "on"), ("off", "off"), ("control", "off")):
        trainer = _city_trainer(tmp_path / name, mode, extra)
        assert trainer.plan.lazy_sh_adam == (mode == "on")
        waiting = []
        for step in range(60):
            trainer.train_step(step)
            if trainer.shard.lazy is not None:
                lazy = trainer.shard.lazy
                waiting.append(float((lazy.applied < lazy.count).float().mean()))
        state = trainer.shard.state_dict()  # caught up
        runs[name] = (
            {k: v.detach().clone() for k, v in state["params"].items()},
            {k: o.state[trainer.params[k]]["exp_avg_sq"].clone() for k, o in trainer.optimizers.items()},
            waiting,
        )
        if mode == "on":
            assert max(waiting) > 0.5, waiting  # most SH rows waited at some step
            assert bool((trainer.shard.lazy.applied == trainer.shard.lazy.count).all())

    def rel(a, b):
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    for i, what in ((0, "params"), (1, "exp_avg_sq")):
        for k, want in runs["off"][i].items():
            got, noise = runs["on"][i][k], rel(runs["control"][i][k], want)
            print(f"{what} {k}: on vs off {rel(got, want):.2e}, control {noise:.2e}")
            # moments: at least 3e-3 (the control alone spans 1e-4 to 1.5e-3 between calls)
            bound = 10 * noise + 1e-4 if what == "params" else max(10 * noise, 3e-3)
            assert rel(got, want) <= bound, (what, k, rel(got, want), noise)


if __name__ == "__main__" and sys.argv[1:2] == ["kernel"]:
    problem = make_problem(0)
    rows = torch.rand(problem["sh0"].shape[0], generator=torch.Generator().manual_seed(9)) < 0.5
    problem_k0 = make_problem(1, N=200, KR=0)
    torch.save(
        dict(
            problem=problem,
            flush=run_flush(problem),
            rows=rows,
            flush_rows=run_flush(problem, rows),
            problem_k0=problem_k0,
            flush_k0=run_flush(problem_k0),
            sequence=run_sequence(2, "cpu"),
            sequence_strided=run_sequence(4, "cpu", N=120, steps=7, programs=1, share=0.9),
            list_seen=run_list_seen(5),
            projection=run_projection(3),
            projection_k4=run_projection(8, K=4, programs=1),
            backward=run_backward(7),
        ),
        sys.argv[2],
    )
