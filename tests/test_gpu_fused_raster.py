"""The compiled native fused kernel (kernels/csrc, built by kernels/native.py) on a GPU against the
PyTorch reference, on fresh random scenes: the loss within relative 1e-5, each gradient tensor
(and the image) within ||a - b|| / ||b|| <= 1e-4, tiles of 0, 1, 255, 256, 257 and over 2,000
Gaussians, saturated pixels, origins, dense and packed. Before each run the CUDA caching
allocator's free memory is poisoned with NaN, so the kernel's scratch (uninitialized) and any
output it fails to write show up. Marked ``gpu``; skipped without CUDA."""

import os

import pytest
import torch

from test_fused_raster import CASES, assert_matches, compare

from splat_train.kernels import fused_raster as fr

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")]

SEED = int.from_bytes(os.urandom(3), "little")  # fresh scenes every run; printed on failure
GPU_CASES = dict(CASES)
GPU_CASES.update(
    {
        "long_lists": dict(lists=(4000, 2049, 0, 1, 31, 32), seed=0, bg=True, lam=0.2),
        "long_lists_saturated": dict(
            lists=(3000, 511, 512, 513, 0, 1), seed=0, bg=True, lam=0.5, opaque=True, origin=(7, 3)
        ),
    }
)


def _poison():
    block = torch.full((256 << 20,), float("nan"), device="cuda")  # 1 GiB, returned to the cache
    del block


@pytest.fixture(scope="module")
def native_module():
    from splat_train.kernels import native

    ext = native.load()
    assert ext is not None, f"the native kernel did not build: {native.LOAD_ERROR}"
    return ext


@pytest.mark.parametrize("repeat", [0, 1])
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_native_kernel_matches_reference(native_module, case, repeat):
    params = dict(GPU_CASES[case], seed=SEED + 1000 * repeat + GPU_CASES[case]["seed"])
    _poison()
    r = compare(params, fr.fused_raster_loss, device="cuda")
    assert_matches(r, params, f"{case} (seed {params['seed']})")
    if "lists" in params:
        assert r["counts"] == list(params["lists"])


def test_native_kernel_is_repeatable_up_to_atomics(native_module):
    """Two runs on the same inputs: the same loss bit for bit (per-tile sums in a fixed order), the
    gradients equal up to the order of atomic additions."""
    from test_fused_raster import _call, _leaves, make_list_scene

    scene = make_list_scene(lists=(2100, 257, 256, 255, 1, 0), seed=SEED, bg=True, origin=(0, 0))
    scene = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in scene.items()}
    outs = []
    for _ in range(2):
        _poison()
        names, leaves = _leaves(scene)
        loss, _ = _call(fr.fused_raster_loss, scene, leaves, names)
        outs.append((loss.item(), torch.autograd.grad(loss, leaves)))
    assert outs[0][0] == outs[1][0]
    for a, b in zip(outs[0][1], outs[1][1]):
        assert float((a - b).norm() / b.norm()) <= 1e-6


@pytest.mark.parametrize("case", ["long_lists", "origin_packed"])
def test_native_kernel_in_chunks_of_tiles(native_module, monkeypatch, case):
    """A scratch cap of a few buckets: several launches over one reused checkpoint buffer."""
    monkeypatch.setenv("SPLAT_TRAIN_FUSED_SCRATCH_MB", "0.05")
    params = dict(GPU_CASES[case], seed=SEED + GPU_CASES[case]["seed"])
    _poison()
    assert_matches(compare(params, fr.fused_raster_loss, device="cuda"), params, f"{case} (seed {params['seed']})")


def test_native_kernel_writes_grads_out(native_module):
    """grads_out on the GPU: buffers holding NaN come back with the gradients autograd gets from
    the default call (up to the order of atomic additions), the same loss bit for bit, detached."""
    from test_fused_raster import _call, _leaves, make_list_scene

    scene = make_list_scene(lists=(2100, 257, 256, 255, 1, 0), seed=SEED, bg=True, origin=(0, 0))
    scene = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in scene.items()}
    names, leaves = _leaves(scene)
    loss, _ = _call(fr.fused_raster_loss, scene, leaves, names)
    want = dict(zip(names, torch.autograd.grad(loss, leaves)))
    out = {n: torch.full_like(scene[n], float("nan")) for n in ("means2d", "conics", "colors", "opacities")}
    names, leaves = _leaves(scene)
    got, _ = _call(fr.fused_raster_loss, scene, leaves, names, grads_out=out)
    assert got.grad_fn is None and got.item() == loss.item()
    for n, g in out.items():
        assert want[n].abs().sum() > 0, n
        assert float((g - want[n]).norm() / want[n].norm()) <= 1e-6, n
