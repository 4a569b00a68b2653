"""The first step's memory estimate (trainer/memory.py) and the guard that refuses a run whose
first step cannot fit, before any image is decoded."""

from pathlib import Path

import numpy as np
import pycolmap
import pytest
import torch

from scenes import add_posed_image, make_cameras, make_scene

from splat_train.kernels import reference as ref
from splat_train.trainer import memory
from splat_train.trainer.cli import main, parse_args
from splat_train.trainer.data import sampler
from splat_train.trainer.memory import GIB, Footprint, available_memory, check_first_step, estimate_step, footprint

REAL_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _composited(gaussians, viewmat, K, width, height):
    """(tile intersections, composited pairs) of the reference rasterizer for one camera."""
    radii, means2d, depths, conics, _ = ref.fully_fused_projection(
        gaussians["means"],
        None,
        gaussians["quats"],
        gaussians["scales"],
        viewmat[None],
        K[None],
        width,
        height,
        opacities=gaussians["opacities"],
    )
    tw, th = -(-width // 16), -(-height // 16)
    _, isect_ids, flatten_ids = ref.isect_tiles(means2d, radii, depths, 16, tw, th)
    offsets = ref.isect_offset_encode(isect_ids, 1, tw, th)
    opacities = gaussians["opacities"][None].expand(1, -1)
    pixel_ids, *_ = ref.compositing_weights(means2d, conics, opacities, width, height, 16, offsets, flatten_ids)
    return isect_ids.numel(), pixel_ids.numel()


@pytest.mark.parametrize(
    "num, opacity, log_scale",
    [
        (300, None, -3.0),  # small Gaussians: few overlap, no pixel reaches the transmittance floor
        (3000, 0.1, -1.2),  # large, dense, at the initial opacity: every pixel stops early (the cap)
        (2000, 0.6, -1.8),
    ],
)
def test_footprint_counts_intersections_exactly_and_pairs_from_above(num, opacity, log_scale):
    g = make_scene(7, num_gaussians=num, sh_degree=0)
    g["scales"] = torch.exp(torch.randn(num, 3, generator=torch.Generator().manual_seed(1)) * 0.3 + log_scale)
    if opacity is not None:
        g["opacities"] = torch.full((num,), opacity)
    for viewmat, K, w, h, _ in make_cameras([(96, 64), (61, 77)]):
        fp = footprint(g, viewmat, K, w, h)
        isects, pairs = _composited(g, viewmat, K, w, h)
        assert fp.isects == isects and fp.pixels == w * h
        assert pairs > 0 and 0.95 <= fp.pairs / pairs <= 1.35, (fp.pairs, pairs)


def test_estimate_terms_follow_the_backend_and_world_size():
    fp = Footprint(width=400, height=300, visible=9_000, isects=200_000, pairs=30e6)
    reference = estimate_step("reference", fp, 10_000, world_size=1, batch_size=1, sh_degree=3, image_bytes=123)
    assert reference.terms["pairs"] == 30e6 * memory.PAIR_BYTES and reference.terms["images"] == 123
    assert reference.terms["exchange"] == 0 and reference.terms["chunk"] == ref.CHUNK_ELEMENTS * 48
    gsplat = estimate_step("gsplat", fp, 10_000, world_size=2, batch_size=2, sh_degree=3)
    # gsplat keeps no per-pair state; its intersection buffers and the exchange are what grows
    assert gsplat.terms["pairs"] == gsplat.terms["chunk"] == 0
    assert gsplat.terms["intersections"] == 2 * 200_000 * 32
    assert gsplat.terms["exchange"] == 2 * 10_000 * 192 and gsplat.terms["state"] == 5_000 * 944
    assert gsplat.terms["projection"] == 2 * 2 * 5_000 * (384 + 24 * 16)  # C W x N_r x (384 + 24 K)
    assert gsplat.total < reference.total


def _colmap_scene(root: Path, width: int, height: int, num_points: int = 300) -> Path:
    """Three cameras around the origin looking at it, flat grey images, random SfM points."""
    import imageio.v3 as iio

    (root / "images").mkdir(parents=True)
    (root / "sparse" / "0").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rec = pycolmap.Reconstruction()
    f = 0.8 * width
    for i in range(3):
        camera = pycolmap.Camera(
            model="PINHOLE", width=width, height=height, params=[f, f, width / 2, height / 2], camera_id=i + 1
        )
        name = f"im{i}.png"
        iio.imwrite(root / "images" / name, np.full((height, width, 3), 100, np.uint8))
        w2c = np.eye(4)[:3, :4]
        w2c[:, 3] = [0.2 * (i - 1), 0.0, 3.0]
        add_posed_image(rec, camera, pycolmap.Image(name=name, camera_id=i + 1, image_id=i + 1), pycolmap.Rigid3d(w2c))
    for xyz in rng.uniform(-1, 1, (num_points, 3)):
        rec.add_point3D(xyz, pycolmap.Track(), np.array([120, 130, 140], np.uint8))
    rec.write(str(root / "sparse" / "0"))
    return root


def test_gpu_estimate_against_a_fake_device_memory_figure(tmp_path):
    """The GPU path (gsplat buffers, free device memory) without a GPU: nothing here touches CUDA."""
    from splat_train.trainer.cli import build_scene

    cfg = parse_args(
        ["default", "--data_dir", str(_colmap_scene(tmp_path / "s", 64, 48)), "--data_factor", "1", "--test_every", "0"]
    )
    scene = build_scene(cfg)
    cuda = torch.device("cuda", 0)
    line = check_first_step(cfg, scene, 1, cuda, available=(80 * GIB, "free memory on cuda:0"))
    assert line.startswith("memory: the first step needs about") and "gsplat rasterizer" in line
    with pytest.raises(ValueError) as e:
        check_first_step(cfg, scene, 1, cuda, available=(1 << 20, "free memory on cuda:0"))
    assert "free memory on cuda:0" in str(e.value) and "--data_factor" in str(e.value)
    assert "more GPUs (--nproc_per_node)" in str(e.value)


def test_available_host_memory_is_positive_and_below_the_total():
    free, what = available_memory(torch.device("cpu"))
    total = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    assert what == "available host memory" and 0 < free <= total


@pytest.fixture
def decoded(monkeypatch):
    """The images the Dataset decodes (each call of load_view), recorded."""
    calls = []
    real = sampler.load_view
    monkeypatch.setattr(sampler, "load_view", lambda scene, i, *a: calls.append(i) or real(scene, i, *a))
    return calls


def test_oversized_cpu_run_is_refused_before_any_image_is_decoded(tmp_path, monkeypatch, capsys, decoded):
    data = _colmap_scene(tmp_path / "big", 2000, 1500)
    monkeypatch.setattr(memory, "available_memory", lambda device: (2 * GIB, "available host memory"))
    out = tmp_path / "run"
    assert (
        main(
            [
                "default",
                "--data_dir",
                str(data),
                "--data_factor",
                "1",
                "--device",
                "cpu",
                "--init_type",
                "random",
                "--init_num_pts",
                "20000",
                "--result_dir",
                str(out),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the first training step needs about")
    for flag in ("--data_factor (now 1", "--init_num_pts (now 20,000)", "--backend gsplat"):
        assert flag in err[0], flag
    assert "2.0 GiB of available host memory" in err[0] and "2000x1500" in err[0]
    assert decoded == [] and not out.exists()
    # what the message suggests: 1/64 of the pixels and fewer initial Gaussians fit, and train
    monkeypatch.setenv("SPLAT_TRAIN_CACHE", str(tmp_path / "cache"))
    assert (
        main(
            [
                "default",
                "--data_dir",
                str(data),
                "--data_factor",
                "8",
                "--device",
                "cpu",
                "--init_type",
                "random",
                "--init_num_pts",
                "500",
                "--max_steps",
                "1",
                "--num_traj_frames",
                "0",
                "--test_every",
                "0",
                "--result_dir",
                str(out),
            ]
        )
        == 0
    )
    assert decoded and (out / "ckpts/ckpt_1_rank0.pt").is_file()


@pytest.mark.skipif(not (REAL_DATA / "juicebox").is_dir(), reason=f"real dataset juicebox not found under {REAL_DATA}")
def test_juicebox_at_full_resolution_on_cpu_is_refused(tmp_path, monkeypatch, capsys, decoded):
    """1920x1080 images: about 300 M composited pairs at step 1, beyond a 16 GiB host (the figure
    is fixed here so the test does not depend on this machine's memory)."""
    monkeypatch.setattr(memory, "available_memory", lambda device: (16 * GIB, "available host memory"))
    assert (
        main(
            [
                "default",
                "--data_dir",
                str(REAL_DATA / "juicebox"),
                "--data_factor",
                "1",
                "--device",
                "cpu",
                "--result_dir",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "8,435 initial Gaussians at 1920x1080" in err and "--data_factor (now 1" in err
    assert decoded == [] and not (tmp_path / "run").exists()


def test_a_large_model_is_measured_on_a_sample(monkeypatch, tmp_path):
    """Above MAX_ESTIMATE_GAUSSIANS the footprint is measured on a strided sample whose scales come
    from the whole set, and scaled back: within sampling noise of measuring everything."""
    from splat_train.trainer import memory
    from splat_train.trainer.cli import build_scene

    cfg = parse_args(
        [
            "default",
            "--init_type",
            "random",
            "--init_num_pts",
            "4000",
            "--synthetic_image_size",
            "64",
            "--result_dir",
            str(tmp_path),
        ]
    )
    scene = build_scene(cfg)
    whole = memory.first_step_estimate(cfg, scene, 1, torch.device("cpu"))
    monkeypatch.setattr(memory, "MAX_ESTIMATE_GAUSSIANS", 1000)
    sampled = memory.first_step_estimate(cfg, scene, 1, torch.device("cpu"))
    assert sampled.num_gaussians == whole.num_gaussians == 4000
    assert whole.footprint.isects > 1000
    assert abs(sampled.footprint.isects / whole.footprint.isects - 1) < 0.1  # a quarter of the points:
    assert abs(sampled.footprint.visible / whole.footprint.visible - 1) < 0.1  # ~300 visible, ~6% noise
    assert abs(sampled.footprint.pairs / whole.footprint.pairs - 1) < 0.1


RECORD_ESTIMATE = """
import json, sys
from splat_train.trainer import cli, memory

real = memory.first_step_estimate


def record(*args, **kwargs):
    estimate = real(*args, **kwargs)
    with open(sys.argv[1], "w") as f:
        json.dump(estimate.terms, f)
    return estimate


memory.first_step_estimate = record
if __name__ == "__main__":
    code = cli.main(sys.argv[2:])
    with open(sys.argv[1] + ".peak", "w") as f:  # this process's high-water mark since its exec
        f.write(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
    sys.exit(code)
"""

SHORT_RUN = [
    "default",
    "--device",
    "cpu",
    "--synthetic_num_cameras",
    "8",
    "--synthetic_image_size",
    "128",
    "--synthetic_num_gaussians",
    "2000",
    "--sh_degree",
    "1",
    "--max_steps",
    "3",
    "--test_every",
    "0",
    "--num_traj_frames",
    "0",
]


def test_the_estimate_is_within_10_percent_of_a_short_runs_peak_resident_memory(tmp_path):
    """A real training run in a child process (W = 1): its peak resident memory (VmHWM of its
    /proc/self/status at the end; ru_maxrss would count the pytest process it was forked from)
    against the estimate the run printed. The runtime term (the interpreter, torch and the
    libraries, which the estimate once left out) is most of it here."""
    import json
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(RECORD_ESTIMATE)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "terms.json"), *SHORT_RUN, "--result_dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    terms = json.loads((tmp_path / "terms.json").read_text())
    peak = int((tmp_path / "terms.json.peak").read_text()) * 1024  # kB
    estimate = sum(terms.values())
    assert terms["runtime"] > 200 * 2**20  # torch alone is more than that, resident
    assert estimate - terms["runtime"] > 20 * 2**20  # the step's own buffers count too
    assert 0.9 <= estimate / peak <= 1.1, (estimate / 2**20, peak / 2**20, terms)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
@pytest.mark.parametrize("raster", ["unfused", "fused"])
def test_gpu_estimate_is_within_10_percent_of_the_peak_allocated(tmp_path, raster, capsys):
    """On a GPU the estimate (no runtime term: the CUDA context is outside the allocator) against
    torch.cuda.max_memory_allocated over a short run of a COLMAP scene, in this process."""
    from splat_train.trainer.cli import build_scene

    data = _colmap_scene(tmp_path / "s", 640, 480, num_points=300)
    flags = [
        "default",
        "--data_dir",
        str(data),
        "--data_factor",
        "1",
        "--init_type",
        "random",
        "--init_num_pts",
        "200000",
        "--test_every",
        "0",
        "--max_steps",
        "5",
        "--num_traj_frames",
        "0",
        "--raster",
        raster,
        "--device",
        "cuda",
        "--nproc_per_node",
        "1",
    ]
    cfg = parse_args([*flags, "--result_dir", str(tmp_path / "r")])
    estimate = memory.first_step_estimate(cfg, build_scene(cfg), 1, torch.device("cuda", 0))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    assert main([*flags, "--result_dir", str(tmp_path / "r")]) == 0
    peak = torch.cuda.max_memory_allocated()
    print({k: round(v / 2**20, 1) for k, v in estimate.terms.items()}, "peak MiB", round(peak / 2**20, 1))
    assert estimate.terms["runtime"] == 0
    assert 0.9 <= estimate.total / peak <= 1.1, (estimate.total / 2**20, peak / 2**20, estimate.terms)
