"""Tests for trainer/losses.py and trainer/metrics.py (CPU; one `gpu` test for CUDA)."""

import importlib
import importlib.machinery
import importlib.util
import math
import os
import sys
import types

import numpy as np
import pytest
import torch

from splat_train.trainer import losses, metrics


def _images(batch, height, width, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(batch, height, width, 3, generator=generator, dtype=dtype)


def _reference_ssim(img1, img2, window_size=11, sigma=1.5, padding="same"):
    """Straightforward SSIM in float64 numpy: an explicit loop over output pixels, centered
    (two-pass) weighted moments; "same" pads the images with zeros first."""
    x = np.asarray(img1, dtype=np.float64)  # [B, H, W, 3]
    y = np.asarray(img2, dtype=np.float64)
    half = window_size // 2
    g = np.array([math.exp(-((i - half) ** 2) / (2 * sigma**2)) for i in range(window_size)])
    window = np.outer(g, g) / np.outer(g, g).sum()
    if padding == "same":
        zeros = ((0, 0), (half, half), (half, half), (0, 0))
        x, y = np.pad(x, zeros), np.pad(y, zeros)
    out_h, out_w = x.shape[1] - 2 * half, x.shape[2] - 2 * half
    c1, c2 = 0.01**2, 0.03**2
    values = []
    for i in range(out_h):
        for j in range(out_w):
            px = x[:, i : i + window_size, j : j + window_size, :]  # [B, S, S, 3]
            py = y[:, i : i + window_size, j : j + window_size, :]
            mx = np.einsum("bijc,ij->bc", px, window)
            my = np.einsum("bijc,ij->bc", py, window)
            vx = np.einsum("bijc,ij->bc", (px - mx[:, None, None]) ** 2, window)
            vy = np.einsum("bijc,ij->bc", (py - my[:, None, None]) ** 2, window)
            cxy = np.einsum("bijc,ij->bc", (px - mx[:, None, None]) * (py - my[:, None, None]), window)
            values.append(((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2)))
    return float(np.mean(values))


# ---------------------------------------------------------------- SSIM


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_ssim_identical_images_is_one(padding):
    img = _images(2, 24, 20, seed=0)
    assert losses.ssim(img, img, padding=padding).item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_ssim_matches_independent_loop_implementation(padding):
    img1 = _images(2, 16, 14, seed=1)
    img2 = (img1 + 0.2 * _images(2, 16, 14, seed=2)).clamp(0, 1)
    expected = _reference_ssim(img1.numpy(), img2.numpy(), padding=padding)
    got32 = losses.ssim(img1, img2, padding=padding).item()
    got64 = losses.ssim(img1.double(), img2.double(), padding=padding).item()
    assert got32 == pytest.approx(expected, abs=1e-5)
    assert got64 == pytest.approx(expected, abs=1e-10)
    assert expected < 0.99  # the images are really different


def test_ssim_same_and_valid_differ_and_map_shapes():
    img1, img2 = _images(1, 20, 18, seed=3), _images(1, 20, 18, seed=4)
    assert losses.ssim_map(img1, img2, padding="same").shape == (1, 20, 18, 3)
    assert losses.ssim_map(img1, img2, padding="valid").shape == (1, 10, 8, 3)
    same, valid = losses.ssim(img1, img2, padding="same"), losses.ssim(img1, img2, padding="valid")
    assert abs(same.item() - valid.item()) > 1e-4


def test_ssim_of_constant_offset_known_value():
    # x = a everywhere, y = a + c: variances and covariance vanish, so in the valid region
    # SSIM = (2 a (a + c) + C1) / (a^2 + (a + c)^2 + C1) exactly.
    a, c = 0.5, 0.1
    img = torch.full((1, 15, 15, 3), a, dtype=torch.float64)
    expected = (2 * a * (a + c) + 0.01**2) / (a**2 + (a + c) ** 2 + 0.01**2)
    assert losses.ssim(img, img + c, padding="valid").item() == pytest.approx(expected, abs=1e-12)
    # A textured image plus an offset: the structure term stays 1, only luminance drops.
    tex = 0.5 * _images(1, 15, 15, seed=5, dtype=torch.float64)
    value = losses.ssim(tex, tex + c, padding="valid").item()
    assert 0.9 < value < 1.0


@pytest.fixture
def one_thread():
    """gradcheck runs thousands of tiny convolutions; on a busy CPU, intra-op threads only
    contend (measured: 88 ms instead of 0.9 ms per call), so use one and restore after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_ssim_gradients_match_finite_differences(one_thread):
    img1 = _images(1, 12, 13, seed=6, dtype=torch.float64).requires_grad_()
    img2 = _images(1, 12, 13, seed=7, dtype=torch.float64).requires_grad_()
    for padding in ("same", "valid"):
        assert torch.autograd.gradcheck(
            lambda a, b: losses.ssim(a, b, padding=padding), (img1, img2), eps=1e-6, atol=1e-7
        )


def test_ssim_float32_gradient_is_finite_and_nonzero():
    render = _images(2, 32, 40, seed=8).requires_grad_()
    losses.ssim(render, _images(2, 32, 40, seed=9)).backward()
    assert torch.isfinite(render.grad).all()
    assert render.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "shape1, shape2, kwargs",
    [
        ((1, 16, 16, 3), (1, 16, 16, 4), {}),  # mismatched shapes
        ((1, 16, 16, 4), (1, 16, 16, 4), {}),  # not 3 channels
        ((16, 16, 3), (16, 16, 3), {}),  # no batch dimension
        ((1, 8, 8, 3), (1, 8, 8, 3), {"padding": "valid"}),  # smaller than the window
        ((1, 16, 16, 3), (1, 16, 16, 3), {"padding": "reflect"}),
        ((1, 16, 16, 3), (1, 16, 16, 3), {"window_size": 10}),
        ((1, 16, 16, 3), (1, 16, 16, 3), {"backend": "cuda"}),
    ],
)
def test_ssim_rejects_bad_arguments(shape1, shape2, kwargs):
    with pytest.raises(ValueError):
        losses.ssim(torch.rand(shape1), torch.rand(shape2), **kwargs)


def test_ssim_backend_selection(monkeypatch):
    losses._fused_ssim_fn.cache_clear()
    monkeypatch.setitem(sys.modules, "fused_ssim", None)  # import fails, as on this machine
    monkeypatch.setattr(losses, "_triton_ssim_fn", lambda: None)  # and Triton is missing
    try:
        assert losses.ssim_backend("cpu") == "pytorch"
        assert losses.ssim_backend(torch.device("cuda", 0)) == "pytorch"
        with pytest.raises(ImportError):
            losses.ssim(torch.rand(1, 16, 16, 3), torch.rand(1, 16, 16, 3), backend="fused_ssim")

        calls = []

        def fake_fused_ssim(img1, img2, padding="same", train=True):  # NCHW, like the package
            calls.append((tuple(img1.shape), padding, train))
            return losses.ssim(img1.permute(0, 2, 3, 1), img2.permute(0, 2, 3, 1), padding=padding)

        monkeypatch.setitem(sys.modules, "fused_ssim", types.SimpleNamespace(fused_ssim=fake_fused_ssim))
        losses._fused_ssim_fn.cache_clear()
        assert losses.ssim_backend("cuda") == "fused_ssim"
        assert losses.ssim_backend("cpu") == "pytorch"
        img1, img2 = torch.rand(2, 16, 12, 3), torch.rand(2, 16, 12, 3)
        forced = losses.ssim(img1, img2, padding="valid", backend="fused_ssim")
        assert calls == [((2, 3, 16, 12), "valid", False)]
        assert forced.item() == pytest.approx(losses.ssim(img1, img2, padding="valid").item())
    finally:
        losses._fused_ssim_fn.cache_clear()


# ---------------------------------------------------------------- loss and regularizers


def test_photometric_loss_combines_l1_and_dssim():
    renders = _images(2, 16, 16, seed=10).requires_grad_()
    gts = _images(2, 16, 16, seed=11)
    loss, terms = losses.photometric_loss(renders, gts, ssim_lambda=0.2)
    l1 = (renders - gts).abs().mean().item()
    ssim_value = losses.ssim(renders, gts).item()
    assert terms["l1"].item() == pytest.approx(l1, rel=1e-6)
    assert terms["ssim"].item() == pytest.approx(ssim_value, rel=1e-6)
    assert loss.item() == pytest.approx(0.8 * l1 + 0.2 * (1 - ssim_value), rel=1e-6)
    assert not terms["l1"].requires_grad and not terms["ssim"].requires_grad
    loss.backward()
    assert torch.isfinite(renders.grad).all() and renders.grad.abs().sum() > 0

    only_l1, _ = losses.photometric_loss(renders, gts, ssim_lambda=0.0)
    only_dssim, _ = losses.photometric_loss(renders, gts, ssim_lambda=1.0)
    assert only_l1.item() == pytest.approx(l1, rel=1e-6)
    assert only_dssim.item() == pytest.approx(1 - ssim_value, rel=1e-6)
    same, _ = losses.photometric_loss(gts, gts)
    assert same.item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError):
        losses.photometric_loss(renders, gts, ssim_lambda=1.5)


def test_regularizers_follow_gsplat_formulas():
    raw_opacities = torch.tensor([-2.0, 0.0, 3.0])
    log_scales = torch.tensor([[-1.0, 0.0, 1.0], [-3.0, -2.0, 0.5]])
    expected_opacity = 0.01 * torch.sigmoid(raw_opacities).mean().item()
    expected_scale = 0.02 * torch.exp(log_scales).mean().item()
    assert losses.opacity_reg(torch.sigmoid(raw_opacities), 0.01).item() == pytest.approx(expected_opacity)
    assert losses.scale_reg(torch.exp(log_scales), 0.02).item() == pytest.approx(expected_scale)
    assert losses.opacity_reg(torch.sigmoid(raw_opacities), 0.0).item() == 0.0
    assert losses.scale_reg(torch.zeros(0, 3), 0.02).item() == 0.0
    opacities = torch.sigmoid(raw_opacities).requires_grad_()
    losses.opacity_reg(opacities, 0.3).backward()
    assert torch.allclose(opacities.grad, torch.full((3,), 0.1))


# ---------------------------------------------------------------- metrics


def test_psnr_known_values_per_image():
    gt = torch.zeros(3, 8, 8, 3)
    pred = torch.stack([torch.full((8, 8, 3), 0.1), torch.full((8, 8, 3), 0.5), torch.zeros(8, 8, 3)])
    values = metrics.psnr(pred, gt)
    assert values.shape == (3,)
    assert values[0].item() == pytest.approx(20.0, abs=1e-4)  # MSE 0.01
    assert values[1].item() == pytest.approx(10 * math.log10(4), abs=1e-4)  # MSE 0.25
    assert math.isinf(values[2].item()) and values[2].item() > 0
    with pytest.raises(ValueError):
        metrics.psnr(pred, gt[:2])


def test_metrics_ssim_is_per_image_and_reuses_losses_ssim():
    pred, gt = _images(3, 20, 20, seed=12), _images(3, 20, 20, seed=13)
    pred[1] = gt[1]
    values = metrics.ssim(pred, gt)
    assert values.shape == (3,)
    assert values[1].item() == pytest.approx(1.0, abs=1e-6)
    assert values[0].item() == pytest.approx(losses.ssim(pred[:1], gt[:1], padding="valid").item())
    assert values[2].item() < 0.5


def test_lpips_reports_unavailable_without_raising(monkeypatch):
    for name in ("torchmetrics", "lpips"):  # as on the CPU machine, whatever this one has
        monkeypatch.setitem(sys.modules, name, None)
    metric = metrics.LPIPSMetric()
    assert metric.available is False and metric.backend is None
    assert "torchmetrics" in metric.reason and "lpips" in metric.reason
    with pytest.raises(RuntimeError, match="LPIPS unavailable"):
        metric(torch.rand(1, 16, 16, 3), torch.rand(1, 16, 16, 3))
    with pytest.raises(ValueError):
        metrics.LPIPSMetric(net="resnet")


def test_lpips_never_raises_in_this_environment():
    metric = metrics.LPIPSMetric()
    assert metric.available or metric.reason  # unavailable always says why


def _fake_lpips_backends(monkeypatch, built):
    """torchmetrics and torchvision stand-ins (the CPU machine has no working torchvision): the
    LPIPS class records its arguments and, as torchvision does for pretrained weights, loads the
    backbone through torch.hub's cache by torchvision's URL (nothing is downloaded when the file
    is there; anything else fails)."""
    urls = {
        "alex": "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth",
        "vgg": "https://download.pytorch.org/models/vgg16-397923af.pth",
    }

    class FakeLPIPS(torch.nn.Module):
        def __init__(self, net_type, normalize):
            super().__init__()
            cached = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(urls[net_type]))
            assert os.path.exists(cached), f"would download {urls[net_type]}"
            state = torch.hub.load_state_dict_from_url(urls[net_type], progress=False)
            built.append(dict(net=net_type, normalize=normalize, state=state))

        def forward(self, x, y):
            return (x - y).abs().mean()

        def reset(self):
            pass

    fake_lpip = types.ModuleType("torchmetrics.image.lpip")
    fake_lpip.LearnedPerceptualImagePatchSimilarity = FakeLPIPS
    for name, module in [
        ("torchmetrics", types.ModuleType("torchmetrics")),
        ("torchmetrics.image", types.ModuleType("torchmetrics.image")),
        ("torchmetrics.image.lpip", fake_lpip),
        ("torchvision", types.ModuleType("torchvision")),
    ]:
        monkeypatch.setitem(sys.modules, name, module)


def test_lpips_checks_local_weights_before_building(monkeypatch, tmp_path):
    """With fake torchmetrics/torchvision: no weights file -> unavailable naming it; file -> built."""
    built = []
    _fake_lpips_backends(monkeypatch, built)
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path))

    metric = metrics.LPIPSMetric(net="alex")
    assert not metric.available and built == []
    assert str(tmp_path / "checkpoints" / "alexnet-owt-7be5be79.pth") in metric.reason

    (tmp_path / "checkpoints").mkdir()
    torch.save({}, tmp_path / "checkpoints" / "alexnet-owt-7be5be79.pth")
    metric = metrics.LPIPSMetric(net="alex")
    assert metric.available and metric.backend == "torchmetrics" and metric.reason == ""
    assert [(b["net"], b["normalize"]) for b in built] == [("alex", True)]
    pred, gt = torch.zeros(2, 8, 8, 3), torch.zeros(2, 8, 8, 3)
    gt[1] += 0.5
    assert torch.allclose(metric(pred, gt), torch.tensor([0.0, 0.5]))


def test_lpips_vgg_is_the_inria_evaluation_and_a_named_backbone_file_is_used(monkeypatch, tmp_path):
    built = []
    _fake_lpips_backends(monkeypatch, built)
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))  # empty: no cached backbone
    assert not metrics.LPIPSMetric(net="vgg").available and built == []

    weights = tmp_path / "my_vgg16.pth"
    torch.save({"features.0.weight": torch.arange(6.0)}, weights)
    metric = metrics.LPIPSMetric(net="vgg", weights=weights)
    assert metric.available, metric.reason
    assert built[-1]["net"] == "vgg" and built[-1]["normalize"] is False  # [0, 1] images fed as they are
    assert torch.equal(built[-1]["state"]["features.0.weight"], torch.arange(6.0))  # the file named
    assert torch.hub.get_dir() == str(tmp_path / "hub")  # the process's hub folder is back
    assert metric.describe() == dict(
        lpips_net="vgg", lpips_normalize=False, lpips_backend="torchmetrics", lpips_weights=str(weights)
    )
    torch.save({"features.0.weight": torch.ones(2)}, weights.with_name("alex.pth"))
    alex = metrics.LPIPSMetric(net="alex", weights=weights.with_name("alex.pth"))
    assert alex.available and built[-1]["net"] == "alex" and built[-1]["normalize"] is True  # gsplat's


def test_a_run_records_which_lpips_net_produced_the_number(monkeypatch, tmp_path):
    import json

    from splat_train.trainer.cli import main

    built = []
    _fake_lpips_backends(monkeypatch, built)
    weights = tmp_path / "vgg.pth"
    torch.save({}, weights)
    tiny = [
        "default",
        "--synthetic_image_size",
        "32",
        "--synthetic_num_cameras",
        "8",
        "--synthetic_num_gaussians",
        "100",
        "--num_traj_frames",
        "0",
        "--max_steps",
        "2",
        "--export_formats",
        "ply",
    ]
    assert (
        main([*tiny, "--lpips_net", "vgg", "--lpips_weights", str(weights), "--result_dir", str(tmp_path / "r")]) == 0
    )
    val = json.loads((tmp_path / "r/stats/val_step2.json").read_text())
    assert val["lpips"] is not None and val["lpips_net"] == "vgg" and val["lpips_normalize"] is False
    assert len(built) == 1  # built once, at start


def test_an_unusable_lpips_weights_file_is_one_error_line_before_training(tmp_path, capsys, monkeypatch):
    from splat_train.trainer.cli import main

    monkeypatch.setitem(sys.modules, "torchvision", None)  # as on this CPU machine, whatever is installed
    tiny = ["default", "--synthetic_image_size", "32", "--max_steps", "2", "--result_dir", str(tmp_path / "r")]
    assert main([*tiny, "--lpips_weights", str(tmp_path / "missing.pth")]) == 2
    assert capsys.readouterr().err.strip() == f"error: --lpips_weights: no such file: {tmp_path / 'missing.pth'}"
    (tmp_path / "vgg.pth").write_bytes(b"not weights")
    assert main([*tiny, "--lpips_net", "vgg", "--lpips_weights", str(tmp_path / "vgg.pth")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --lpips_weights {tmp_path / 'vgg.pth'}: LPIPS unavailable")
    assert not (tmp_path / "r" / "ckpts").exists()  # nothing trained


# ---------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ssim_on_cuda_matches_cpu():
    img1, img2 = _images(2, 64, 48, seed=14), _images(2, 64, 48, seed=15)
    for padding in ("same", "valid"):
        cpu = losses.ssim(img1, img2, padding=padding, backend="pytorch")
        render = img1.cuda().requires_grad_()
        gpu = losses.ssim(render, img2.cuda(), padding=padding)  # fused_ssim when installed
        gpu.backward()
        assert gpu.item() == pytest.approx(cpu.item(), abs=1e-5)
        assert torch.isfinite(render.grad).all() and render.grad.abs().sum() > 0


def test_lpips_imports_no_backend_without_the_backbone_file(monkeypatch, tmp_path):
    """An installed torchmetrics is found, not imported, when the backbone weights are missing
    (its import pulls in transformers where that is installed: seconds at the first evaluation)."""
    real_find, real_import = importlib.util.find_spec, importlib.import_module
    for name in ("torchmetrics", "torchvision", "lpips"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    found = {
        "torchmetrics": importlib.machinery.ModuleSpec("torchmetrics", None),
        "torchvision": importlib.machinery.ModuleSpec("torchvision", None),
    }
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: found.get(name) if name in found or name == "lpips" else real_find(name, *a),
    )
    imported = []
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: imported.append(name) or real_import(name, *a))
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path))
    metric = metrics.LPIPSMetric(net="alex")
    assert not metric.available and "backbone weights" in metric.reason and "not on disk" in metric.reason
    assert not [n for n in imported if n.split(".")[0] in ("torchmetrics", "torchvision", "lpips")]


def test_lpips_falls_back_to_the_lpips_package_when_torchmetrics_fails_to_import(monkeypatch, tmp_path):
    built = []
    _fake_lpips_backends(monkeypatch, built)
    monkeypatch.setitem(sys.modules, "torchmetrics.image.lpip", None)  # installed, but its import fails

    class FakePackage(torch.nn.Module):
        def __init__(self, net, verbose):
            super().__init__()
            built.append(net)

    fake = types.ModuleType("lpips")
    fake.LPIPS = FakePackage
    monkeypatch.setitem(sys.modules, "lpips", fake)
    (tmp_path / "checkpoints").mkdir()
    torch.save({}, tmp_path / "checkpoints" / "alexnet-owt-7be5be79.pth")
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path))
    metric = metrics.LPIPSMetric(net="alex")
    assert metric.available and metric.backend == "lpips" and built == ["alex"]
