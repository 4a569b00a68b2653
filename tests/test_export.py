"""Tests for trainer/export.py: the Inria 3DGS PLY layout, exact round trip, atomic writes."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement

from splat_train.trainer import export


def _splats(num, sh_degree, seed=0):
    generator = torch.Generator().manual_seed(seed)
    num_rest = (sh_degree + 1) ** 2 - 1

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    return {
        "means": randn(num, 3) * 10,
        "scales": randn(num, 3) - 4,
        "quats": randn(num, 4),
        "opacities": randn(num),
        "sh0": randn(num, 1, 3),
        "shN": randn(num, num_rest, 3) * 0.1,
    }


def _inria_names(num_rest):
    """Property list of graphdeco-inria gaussian_model.construct_list_of_attributes, spelled out."""
    names = ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
    names += ["f_rest_" + str(i) for i in range(num_rest * 3)]
    names += ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    return names


@pytest.mark.parametrize("sh_degree", [0, 1, 2, 3])
def test_round_trip_is_bitwise_exact(tmp_path, sh_degree):
    splats = _splats(57, sh_degree, seed=sh_degree)
    path = tmp_path / "scene.ply"
    export.save_ply(path, **splats)
    loaded = export.load_ply(path)
    assert set(loaded) == set(splats)
    for key, tensor in splats.items():
        assert loaded[key].shape == tensor.shape, key
        assert loaded[key].dtype == torch.float32, key
        assert torch.equal(loaded[key], tensor), key


@pytest.mark.parametrize("sh_degree", [0, 3])
def test_file_has_inria_layout_and_plyfile_reads_it(tmp_path, sh_degree):
    splats = _splats(5, sh_degree, seed=7)
    path = tmp_path / "scene.ply"
    export.save_ply(path, **splats)

    with open(path, "rb") as stream:
        header = stream.read(2048).split(b"end_header")[0].decode("ascii")
    assert "format binary_little_endian 1.0" in header
    assert "element vertex 5" in header

    ply = PlyData.read(str(path))
    vertex = ply["vertex"]
    num_rest = (sh_degree + 1) ** 2 - 1
    assert [prop.name for prop in vertex.properties] == _inria_names(num_rest)
    assert all(vertex[name].dtype == np.float32 for name in _inria_names(num_rest))
    assert vertex.count == 5
    # Pre-activation values in their Inria columns; normals zero.
    np.testing.assert_array_equal(vertex["opacity"], splats["opacities"].numpy())
    np.testing.assert_array_equal(vertex["scale_2"], splats["scales"][:, 2].numpy())
    np.testing.assert_array_equal(vertex["rot_0"], splats["quats"][:, 0].numpy())
    np.testing.assert_array_equal(vertex["nx"], np.zeros(5, np.float32))
    if num_rest:
        # Channel-major f_rest: all red coefficients, then green, then blue.
        shN = splats["shN"].numpy()  # [N, K-1, 3]
        np.testing.assert_array_equal(vertex["f_rest_1"], shN[:, 1, 0])
        np.testing.assert_array_equal(vertex[f"f_rest_{num_rest}"], shN[:, 0, 1])
        np.testing.assert_array_equal(vertex[f"f_rest_{3 * num_rest - 1}"], shN[:, -1, 2])


def test_save_accepts_other_dtypes_and_grad_tensors(tmp_path):
    splats = {k: v.double().requires_grad_() for k, v in _splats(4, 1).items()}
    export.save_ply(tmp_path / "a.ply", **splats)
    loaded = export.load_ply(tmp_path / "a.ply")
    assert torch.equal(loaded["means"], splats["means"].detach().float())


def test_save_rejects_inconsistent_shapes(tmp_path):
    splats = _splats(4, 1)
    splats["quats"] = splats["quats"][:, :3]
    with pytest.raises(ValueError, match="quats"):
        export.save_ply(tmp_path / "bad.ply", **splats)
    assert os.listdir(tmp_path) == []


def test_interrupted_write_leaves_previous_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "scene.ply"
    export.save_ply(path, **_splats(10, 1, seed=1))
    before = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated crash"):
        export.save_ply(path, **_splats(20, 2, seed=2))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["scene.ply"]  # no temporary file left behind

    monkeypatch.undo()
    export.save_ply(path, **_splats(20, 2, seed=2))
    assert export.load_ply(path)["means"].shape == (20, 3)


def test_load_names_file_when_property_missing(tmp_path):
    names = [n for n in _inria_names(0) if n != "opacity"]
    vertices = np.zeros(3, dtype=[(name, "<f4") for name in names])
    path = tmp_path / "no_opacity.ply"
    PlyData([PlyElement.describe(vertices, "vertex")]).write(str(path))
    with pytest.raises(ValueError, match=r"no_opacity\.ply.*opacity"):
        export.load_ply(path)


def test_load_rejects_f_rest_count_not_multiple_of_three(tmp_path):
    names = _inria_names(0)
    names.insert(9, "f_rest_0")
    vertices = np.zeros(2, dtype=[(name, "<f4") for name in names])
    path = tmp_path / "odd_rest.ply"
    PlyData([PlyElement.describe(vertices, "vertex")]).write(str(path))
    with pytest.raises(ValueError, match=r"odd_rest\.ply"):
        export.load_ply(path)


def test_a_ply_streamed_in_parts_equals_the_one_written_at_once(tmp_path):
    """export.write_ply_parts (a distributed export's rank-by-rank write) makes the very bytes
    save_ply makes of the same Gaussians."""
    from splat_train.trainer.export import ply_rows, save_ply, write_ply_parts

    gen = torch.Generator().manual_seed(4)
    n = 37
    g = dict(
        means=torch.randn(n, 3, generator=gen),
        scales=torch.randn(n, 3, generator=gen),
        quats=torch.randn(n, 4, generator=gen),
        opacities=torch.randn(n, generator=gen),
        sh0=torch.randn(n, 1, 3, generator=gen),
        shN=torch.randn(n, 15, 3, generator=gen),
    )
    save_ply(tmp_path / "once.ply", **g)
    rows = ply_rows(**g)
    write_ply_parts(tmp_path / "parts.ply", n, 15, [rows[:10], rows[10:10], rows[10:]])
    assert (tmp_path / "parts.ply").read_bytes() == (tmp_path / "once.ply").read_bytes()
    with pytest.raises(ValueError, match="36 Gaussians streamed, 37 declared"):
        write_ply_parts(tmp_path / "short.ply", n, 15, [rows[:36]])
    assert not (tmp_path / "short.ply").exists()


def _stream_three(ctx, out_dir):
    from splat_train.trainer.export import ply_rows, stream_shards

    gen = torch.Generator().manual_seed(10 + ctx.rank)
    n = [5, 0, 9][ctx.rank]  # a rank may own nothing
    g = dict(
        means=torch.randn(n, 3, generator=gen),
        scales=torch.randn(n, 3, generator=gen),
        quats=torch.randn(n, 4, generator=gen),
        opacities=torch.randn(n, generator=gen),
        sh0=torch.randn(n, 1, 3, generator=gen),
        shN=torch.randn(n, 3, 3, generator=gen),
    )
    torch.save(g, f"{out_dir}/shard{ctx.rank}.pt")
    wrote = stream_shards(ctx, ply_rows(**g), Path(out_dir) / "merged.ply", 3)
    assert wrote == ctx.is_main


def test_shards_streamed_to_rank_zero_equal_the_merged_export(tmp_path):
    """Three gloo ranks send their rows to rank 0 one after another; the file equals save_ply of
    the shards concatenated in rank order (what gathering them did)."""
    from splat_train.trainer.export import merge_shards, save_ply
    from splat_train.trainer.launch import launch

    assert launch(_stream_three, (str(tmp_path),), nproc_per_node=3, device="cpu") == 0
    merged = merge_shards([torch.load(tmp_path / f"shard{r}.pt") for r in range(3)])
    save_ply(tmp_path / "gathered.ply", **merged)
    assert (tmp_path / "merged.ply").read_bytes() == (tmp_path / "gathered.ply").read_bytes()
