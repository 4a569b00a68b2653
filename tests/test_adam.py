"""kernels/adam.py (one launch for several parameter tensors) against kernels.reference.adam_update,
and that reference against torch.optim.Adam.

The kernel runs under ``TRITON_INTERPRET=1`` in a child process (``python tests/test_adam.py
kernel IN OUT``), on fresh seeded tensors, with the parameters' state in torch's format; on a GPU
(``-m gpu``) it runs directly."""

import sys

import pytest
import torch

from interpreted import run_interpreted

from splat_train.kernels import adam
from splat_train.kernels.reference import adam_update, selective_adam_update

# sizes: shN-like large, a few-element one, an empty one (SH degree 0's shN), one over a block
SHAPES = [(300, 15, 3), (7,), (5, 0, 3), (1100, 3), (40, 4), (1, 3)]
LRS = [2.5e-3 / 20, 5e-2, 1e-3, 1.6e-4, 5e-3, 2.5e-3]
STEPS = 3


def make_problem(seed: int, shapes=SHAPES):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) * 10 ** (-i % 4) for s in shapes] for i in range(STEPS)]
    return params, grads


def optimizers_for(params, lrs, betas=(0.9**2, 0.999**2), eps=1e-15 / 2**0.5):
    leaves = [torch.nn.Parameter(p.clone()) for p in params]
    return leaves, [torch.optim.Adam([leaf], lr=lr, betas=betas, eps=eps) for leaf, lr in zip(leaves, lrs)]


# --visible_adam: every tensor has one row per Gaussian (N = 1100 spans two blocks of the scalar ones)
SELECTIVE_SHAPES = [(1100, 2, 3), (1100,), (1100, 0, 3), (1100, 3), (1100, 4), (1100, 1, 3)]


def make_visibility(seed: int, n: int = 1100):
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(n, generator=gen) < 0.6 for _ in range(STEPS)]


def run_kernel(params, grads, device, visible=None):
    """adam_step over one optimizer per tensor, STEPS steps (``visible``: the selective step with
    one bool [N] per step); returns the params and moments."""
    leaves, opts = optimizers_for([p.to(device) for p in params], LRS)
    for t, step_grads in enumerate(grads):
        for leaf, g in zip(leaves, step_grads):
            leaf.grad = g.to(device)
        adam.adam_step(opts, None if visible is None else visible[t].to(device))
    state = [opt.state[leaf] for opt, leaf in zip(opts, leaves)]
    return dict(
        params=[leaf.detach().cpu() for leaf in leaves],
        exp_avg=[s["exp_avg"].cpu() for s in state],
        exp_avg_sq=[s["exp_avg_sq"].cpu() for s in state],
        steps=[float(s["step"]) for s in state],
    )


def check(params, grads, got):
    betas, eps = (0.9**2, 0.999**2), 1e-15 / 2**0.5
    for i, (p, lr) in enumerate(zip(params, LRS)):
        m = v = torch.zeros_like(p, dtype=torch.float64)
        p = p.double()
        for t, step_grads in enumerate(grads, start=1):
            p, m, v = adam_update(p, step_grads[i].double(), m, v, t, lr, *betas, eps)
        for name, ref in (("params", p), ("exp_avg", m), ("exp_avg_sq", v)):
            out = got[name][i]
            assert out.shape == ref.shape and torch.isfinite(out).all(), (i, name)
            atol = 1e-6 * float(ref.abs().max()) if ref.numel() else 0.0
            assert torch.allclose(out.double(), ref, rtol=1e-5, atol=atol), (i, name)
        assert got["steps"][i] == STEPS


def check_selective(params, grads, visible, got):
    """gsplat's SelectiveAdam (reference.selective_adam_update): visible rows step without bias
    correction, the others keep their value and moments; the step count does not advance."""
    betas, eps = (0.9**2, 0.999**2), 1e-15 / 2**0.5
    for i, (p, lr) in enumerate(zip(params, LRS)):
        m = v = torch.zeros_like(p, dtype=torch.float64)
        p = p.double()
        for t, step_grads in enumerate(grads):
            p, m, v = selective_adam_update(p, step_grads[i].double(), m, v, visible[t], lr, *betas, eps)
        never = ~torch.stack(visible).any(0)
        assert never.any() and not never.all()
        for name, ref in (("params", p), ("exp_avg", m), ("exp_avg_sq", v)):
            out = got[name][i]
            atol = 1e-6 * float(ref.abs().max()) if ref.numel() else 0.0
            assert torch.allclose(out.double(), ref, rtol=1e-5, atol=atol), (i, name)
        assert torch.equal(got["params"][i][never], params[i][never])  # never visible: untouched
        assert got["steps"][i] == 0


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    if not adam.available():
        pytest.skip("Triton is not installed")
    tmp = tmp_path_factory.mktemp("adam")
    params, grads = make_problem(0)
    sel_params, sel_grads = make_problem(4, SELECTIVE_SHAPES)
    visible = make_visibility(5)
    torch.save(
        dict(params=params, grads=grads, sel_params=sel_params, sel_grads=sel_grads, visible=visible), tmp / "in.pt"
    )
    run_interpreted(__file__, "kernel", str(tmp / "in.pt"), str(tmp / "out.pt"))
    out = torch.load(tmp / "out.pt")
    return params, grads, out["plain"], (sel_params, sel_grads, visible, out["selective"])


def test_kernel_matches_reference_under_the_interpreter(interpreted):
    params, grads, got, _ = interpreted
    check(params, grads, got)


def test_selective_kernel_matches_reference_under_the_interpreter(interpreted):
    check_selective(*interpreted[3])


def test_selective_reference_step_on_the_cpu_path():
    """model.optimizer_step(visible=...) without the kernel (the CPU path): the same update."""
    from splat_train.trainer.model import optimizer_step

    params, grads = make_problem(6, SELECTIVE_SHAPES)
    visible = make_visibility(7)
    leaves, opts = optimizers_for(params, LRS)
    for t, step_grads in enumerate(grads):
        for leaf, g in zip(leaves, step_grads):
            leaf.grad = g
        optimizer_step(dict(enumerate(opts)), visible[t])
    state = [opt.state[leaf] for opt, leaf in zip(opts, leaves)]
    check_selective(
        params,
        grads,
        visible,
        dict(
            params=[leaf.detach() for leaf in leaves],
            exp_avg=[s["exp_avg"] for s in state],
            exp_avg_sq=[s["exp_avg_sq"] for s in state],
            steps=[float(s["step"]) for s in state],
        ),
    )


def _torch_adam_steps(params, grads, grad_scale=1.0) -> dict:
    """STEPS of torch.optim.Adam (one per tensor), in run_kernel's result format."""
    leaves, opts = optimizers_for(params, LRS)
    for step_grads in grads:
        for leaf, g, opt in zip(leaves, step_grads, opts):
            leaf.grad = g * grad_scale
            opt.step()
    state = [o.state[leaf] for o, leaf in zip(opts, leaves)]
    return dict(
        params=[leaf.detach() for leaf in leaves],
        exp_avg=[s["exp_avg"] for s in state],
        exp_avg_sq=[s["exp_avg_sq"] for s in state],
        steps=[float(s["step"]) for s in state],
    )


def test_reference_matches_torch_adam():
    params, grads = make_problem(1)
    check(params, grads, _torch_adam_steps(params, grads))


def test_check_rejects_a_wrong_update():
    params, grads = make_problem(2)
    got = _torch_adam_steps(params, grads, grad_scale=1.01)  # a different gradient: a different trajectory
    with pytest.raises(AssertionError):
        check(params, grads, got)


def test_supported_refuses_what_the_kernel_does_not_do():
    p = torch.nn.Parameter(torch.zeros(4))
    assert adam.supported(torch.optim.Adam([p], lr=0.1))
    assert not adam.supported(torch.optim.Adam([p], lr=0.1, amsgrad=True))
    assert not adam.supported(torch.optim.Adam([p], lr=0.1, weight_decay=1e-4))
    assert not adam.supported(torch.optim.SGD([p], lr=0.1))
    assert not adam.supported(torch.optim.Adam([torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))], lr=0.1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not adam.available(), reason="needs Triton")
@pytest.mark.parametrize("scale", [1, 1000])
def test_kernel_on_gpu_matches_reference(scale):
    shapes = [(s[0] * scale,) + tuple(s[1:]) for s in SHAPES]  # up to 1.1 M elements a tensor
    params, grads = make_problem(3, shapes)
    check(params, grads, run_kernel(params, grads, "cuda"))
    shapes = [(s[0] * scale,) + tuple(s[1:]) for s in SELECTIVE_SHAPES]
    params, grads = make_problem(8, shapes)
    visible = make_visibility(9, shapes[0][0])
    check_selective(params, grads, visible, run_kernel(params, grads, "cuda", visible))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
@pytest.mark.skipif(not adam.available(), reason="needs Triton")
def test_kernel_on_gpu_updates_elements_past_2_31():
    """shN of about 48 M Gaussians on one rank: element offsets past 2^31 (34 GiB of device memory).
    Only the first and last blocks are checked against the formula; a 32-bit offset would wrap to
    negative addresses (fault) or write the head twice and leave the tail untouched."""
    if torch.cuda.get_device_properties(0).total_memory < 48 * 2**30:
        pytest.skip("needs 48 GiB of device memory")
    n = 2**31 + 3 * adam.BLOCK + 5
    p = torch.nn.Parameter(torch.zeros(n, device="cuda"))
    p.grad = torch.ones(n, device="cuda")
    p.grad[-7:] = 2.0
    opt = torch.optim.Adam([p], lr=0.5, eps=1e-15)
    adam.adam_step([opt])
    # first step: m = 0.1 g, v = 0.001 g^2, p = -lr * (m / 0.1) / (sqrt(v / 0.001) + eps) = -lr sign(g)
    torch.cuda.synchronize()
    head, tail = p.detach()[:4096].cpu(), p.detach()[-4096:].cpu()
    assert torch.allclose(head, torch.full_like(head, -0.5)), head.unique()
    assert torch.allclose(tail, torch.full_like(tail, -0.5)), tail.unique()
    exp_avg = opt.state[p]["exp_avg"]
    assert torch.allclose(exp_avg[-7:].cpu(), torch.full((7,), 0.2)), exp_avg[-7:]
    del p, opt, exp_avg
    torch.cuda.empty_cache()


if __name__ == "__main__" and sys.argv[1:2] == ["kernel"]:
    data = torch.load(sys.argv[2])
    torch.save(
        dict(
            plain=run_kernel(data["params"], data["grads"], "cpu"),
            selective=run_kernel(data["sel_params"], data["sel_grads"], "cpu", data["visible"]),
        ),
        sys.argv[3],
    )
