"""Ahead-of-time compiles of the fused kernel for GPU targets, on a machine without a GPU: the
kernel builds for NVIDIA sm_90 and AMD gfx942 (a portability check that needs no device), and the
resource counts the run-time chunk choice relies on are read from the compiled code."""

import json
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"

from splat_train.kernels import fused_ssim, registry, resources  # noqa: E402
from splat_train.scripts import kernel_resources  # noqa: E402

needs_cuobjdump = pytest.mark.skipif(not CUOBJDUMP.exists(), reason="this Triton wheel ships no cuobjdump")


@needs_cuobjdump
def test_compiles_for_sm90_and_reads_registers_and_spills():
    row = registry.compile_kernel("ssim_backward", "cuda:90", 4)
    assert row["target"] == "cuda:90" and row["threads"] == 128
    assert 0 < row["registers"] <= 255 and row["spill_bytes"] >= 0 and row["shared_bytes"] >= 0


def test_compiles_for_gfx942_with_64_wide_wavefronts():
    row = registry.compile_kernel("ssim_forward", "hip:gfx942", 4)
    assert row["target"] == "hip:gfx942" and row["threads"] == 256
    assert row["registers"] > 0 and row["spill_bytes"] >= 0


def test_unknown_target_is_refused():
    for bad in ("cuda:sm90", "metal:1", "hip:"):
        with pytest.raises(ValueError, match="neither"):
            resources.parse_target(bad)


def test_script_refuses_bad_arguments(capsys):
    assert kernel_resources.main(["--targets", "cuda:abc"]) == 2
    assert "--targets" in capsys.readouterr().err


@pytest.fixture
def fake_sm90_device(monkeypatch):
    """Make "cuda:0" look like an H100/H200 (sm_90) to the run-time probes, without a GPU."""
    import contextlib

    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class FakeDriver:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    monkeypatch.setattr(driver, "_active", FakeDriver())
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())


def test_largest_spill_free_rule():
    spills = {8: 0, 16: 0, 32: 24, 64: 0}  # 64 would not be reached: the search stops at 32
    tried = []

    def usage(k):
        tried.append(k)
        return {"spill_bytes": spills[k]}

    assert resources.largest_spill_free(usage, (8, 16, 32, 64)) == 16 and tried == [8, 16, 32]
    assert resources.largest_spill_free(lambda k: {"spill_bytes": 4}, (8, 16)) == 8  # nothing spill-free


@needs_cuobjdump
@pytest.mark.parametrize("target", ["cuda:90", "hip:gfx942"])
def test_every_triton_kernel_compiles_for_both_vendors(target):
    """Portability: every kernel of the package builds for NVIDIA sm_90 and AMD gfx942 (64-wide
    wavefronts) at the configuration its host code launches."""
    for name in registry.kernel_specs():
        row = registry.compile_kernel(name, target)
        assert row["kernel"] == name and row["registers"] > 0 and row["spill_bytes"] >= 0, row


@needs_cuobjdump
def test_spill_free_warps_takes_the_fewest_warps_that_do_not_spill(fake_sm90_device, monkeypatch):
    monkeypatch.setattr(resources, "_WARPS", {})
    assert (
        resources.spill_free_warps("ssim_backward", fused_ssim.kernel_specs, "cpu") == 4
    )  # CPU / interpreter: the default
    warps = resources.spill_free_warps("ssim_backward", fused_ssim.kernel_specs, "cuda:0")
    assert warps in resources.WARP_CANDIDATES
    assert registry.compile_kernel("ssim_backward", "cuda:90", warps)["spill_bytes"] == 0
    for fewer in (w for w in resources.WARP_CANDIDATES if w < warps):
        assert registry.compile_kernel("ssim_backward", "cuda:90", fewer)["spill_bytes"] > 0
    assert resources._WARPS == {("ssim_backward", "cuda:0"): warps}


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="unknown kernel"):
        registry.compile_kernel("no_such_kernel", "cuda:90")


def test_script_all_kernels_lists_each_kernel_once_per_target(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert kernel_resources.main(["--all_kernels", "--targets", "hip:gfx942", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["kernel"] for r in rows] == list(registry.kernel_specs())
    assert "| hip:gfx942 | ssim_forward |" in capsys.readouterr().out


def test_script_without_triton_says_so(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert kernel_resources.main(["--targets", "cuda:90"]) == 2
    assert "needs Triton" in capsys.readouterr().err
