"""Gaussian scene <-> PLY in the layout of the original 3DGS code (Inria), which viewers open.

One vertex element, one float32 property per value, in this order:
    x y z nx ny nz f_dc_0..2 f_rest_0..(3*(K-1)-1) opacity scale_0..2 rot_0..3
with values stored PRE-activation, exactly as trained: log scales, opacity logits, raw
(unnormalized) quaternions wxyz, SH coefficients. Normals are written as zeros (the Inria code
does the same). f_rest is channel-major: the K-1 coefficients of red, then green, then blue
(gaussian_model.py in graphdeco-inria/gaussian-splatting stores features_rest as [N, 3, K-1]).

These functions handle one set of tensors; gathering shards onto one rank (and deciding which
rank writes) is the caller's job.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from plyfile import PlyData, PlyElement

from .fileio import atomic_write

if TYPE_CHECKING:  # pragma: no cover
    from .shard import GaussianShard


def ply_property_names(num_rest_coeffs: int) -> list[str]:
    """Inria's property names, in file order, for K-1 = ``num_rest_coeffs`` SH coefficients per channel."""
    return (
        ["x", "y", "z", "nx", "ny", "nz"]
        + [f"f_dc_{i}" for i in range(3)]
        + [f"f_rest_{i}" for i in range(3 * num_rest_coeffs)]
        + ["opacity"]
        + [f"scale_{i}" for i in range(3)]
        + [f"rot_{i}" for i in range(4)]
    )


def _as_float32_rows(tensor: torch.Tensor, num: int, name: str, shape: tuple) -> np.ndarray:
    if tuple(tensor.shape) != shape:
        raise ValueError(f"save_ply: {name} must have shape {shape}, got {tuple(tensor.shape)}")
    num_columns = int(np.prod(shape[1:]))  # explicit: K-1 = 0 or N = 0 leave -1 ambiguous
    return tensor.detach().to("cpu", torch.float32).reshape(num, num_columns).numpy()


def save_ply(
    path: str | os.PathLike,
    means: torch.Tensor,
    scales: torch.Tensor,
    quats: torch.Tensor,
    opacities: torch.Tensor,
    sh0: torch.Tensor,
    shN: torch.Tensor,
) -> None:
    """Write Gaussians to ``path`` as a binary little-endian 3DGS PLY, atomically.

    Args (any device, cast to float32; pre-activation values):
        means: [N, 3] centers, scene units. scales: [N, 3] log scales. quats: [N, 4] raw wxyz.
        opacities: [N] logits. sh0: [N, 1, 3] DC coefficients. shN: [N, K-1, 3] higher bands,
        K-1 may be 0.

    The file is written to a temporary file in the destination directory, flushed, fsynced
    and moved over ``path`` with os.replace: a reader sees the old file or the new one, never
    a partial one, and a failure leaves any previous file intact (and no temporary file).

    Raises ValueError on inconsistent shapes; OSError from the file system.
    """
    table = ply_rows(means, scales, quats, opacities, sh0, shN)
    num, names = table.shape[0], ply_property_names(shN.shape[1])
    vertex_dtype = np.dtype([(name, "<f4") for name in names])
    vertices = table.astype("<f4", copy=False).view(vertex_dtype).reshape(num)  # [N] records
    ply = PlyData([PlyElement.describe(vertices, "vertex")], text=False, byte_order="<")
    atomic_write(path, ply.write)


def ply_rows(
    means: torch.Tensor,
    scales: torch.Tensor,
    quats: torch.Tensor,
    opacities: torch.Tensor,
    sh0: torch.Tensor,
    shN: torch.Tensor,
) -> np.ndarray:
    """The PLY's vertex rows of these Gaussians: float32 [N, P] in :func:`ply_property_names`
    order (arguments as :func:`save_ply`; raises ValueError on inconsistent shapes)."""
    if means.dim() != 2 or means.shape[1] != 3:
        raise ValueError(f"save_ply: means must have shape [N, 3], got {tuple(means.shape)}")
    num = means.shape[0]
    if shN.dim() != 3 or shN.shape[0] != num or shN.shape[2] != 3:
        raise ValueError(f"save_ply: shN must have shape [N, K-1, 3], got {tuple(shN.shape)}")
    num_rest = shN.shape[1]
    columns = [
        _as_float32_rows(means, num, "means", (num, 3)),
        np.zeros((num, 3), dtype=np.float32),  # normals
        _as_float32_rows(sh0, num, "sh0", (num, 1, 3)),
        _as_float32_rows(shN.transpose(1, 2), num, "shN", (num, 3, num_rest)),  # channel-major
        _as_float32_rows(opacities, num, "opacities", (num,)),
        _as_float32_rows(scales, num, "scales", (num, 3)),
        _as_float32_rows(quats, num, "quats", (num, 4)),
    ]
    table = np.ascontiguousarray(np.concatenate(columns, axis=1), dtype="<f4")  # [N, P] float32
    assert table.shape == (num, len(ply_property_names(num_rest))), table.shape
    return table


def ply_header(num: int, num_rest_coeffs: int) -> bytes:
    """The header plyfile writes for :func:`save_ply`'s file of ``num`` Gaussians (binary little
    endian, one float property per column), so that a file streamed in parts
    (:func:`write_ply_parts`) equals it byte for byte."""
    lines = ["ply", "format binary_little_endian 1.0", f"element vertex {num}"]
    lines += [f"property float {name}" for name in ply_property_names(num_rest_coeffs)]
    return ("\n".join(lines + ["end_header"]) + "\n").encode("ascii")


def write_ply_parts(path: "str | os.PathLike", num: int, num_rest_coeffs: int, parts) -> None:
    """Write a 3DGS PLY of ``num`` Gaussians from ``parts``, an iterable of float32 row blocks
    [n_i, P] (:func:`ply_rows`) whose n_i add up to ``num``, one block in memory at a time;
    atomically, as :func:`save_ply`. Raises ValueError when the rows do not add up."""

    def write(tmp: str) -> None:
        written = 0
        with open(tmp, "wb") as f:
            f.write(ply_header(num, num_rest_coeffs))
            for rows in parts:
                f.write(np.ascontiguousarray(rows, dtype="<f4").tobytes())
                written += rows.shape[0]
        if written != num:
            raise ValueError(f"{path}: {written} Gaussians streamed, {num} declared")

    atomic_write(path, write)


def load_ply(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a 3DGS PLY written by :func:`save_ply` or by the Inria code; inverse of save_ply.

    Returns CPU float32 tensors, pre-activation: "means" [N, 3], "scales" [N, 3], "quats"
    [N, 4], "opacities" [N], "sh0" [N, 1, 3], "shN" [N, K-1, 3], with K-1 inferred from the
    number of f_rest_* properties. Normals are ignored (and optional).

    Raises ValueError naming the file when the vertex element or a property is missing, or the
    f_rest count is not a multiple of 3; FileNotFoundError when the file does not exist.
    """
    path = os.fspath(path)
    ply = PlyData.read(path)
    if "vertex" not in ply:
        raise ValueError(f"{path}: no 'vertex' element; not a 3DGS PLY")
    vertex = ply["vertex"]
    present = {prop.name for prop in vertex.properties}
    num_rest_values = sum(1 for name in present if name.startswith("f_rest_"))
    if num_rest_values % 3 != 0:
        raise ValueError(f"{path}: {num_rest_values} f_rest_* properties, not a multiple of 3")
    num_rest = num_rest_values // 3
    required = [n for n in ply_property_names(num_rest) if n not in ("nx", "ny", "nz")]
    missing = [name for name in required if name not in present]
    if missing:
        raise ValueError(f"{path}: missing PLY vertex properties {missing}")

    def stack(names: list[str]) -> torch.Tensor:
        columns = [np.asarray(vertex[name], dtype=np.float32) for name in names]
        return torch.from_numpy(np.stack(columns, axis=1))  # [N, len(names)]

    num = vertex.count
    rest = stack([f"f_rest_{i}" for i in range(3 * num_rest)]) if num_rest else None
    return {
        "means": stack(["x", "y", "z"]),
        "scales": stack([f"scale_{i}" for i in range(3)]),
        "quats": stack([f"rot_{i}" for i in range(4)]),
        "opacities": stack(["opacity"]).reshape(num),
        "sh0": stack([f"f_dc_{i}" for i in range(3)]).reshape(num, 1, 3),
        "shN": (
            rest.reshape(num, 3, num_rest).transpose(1, 2).contiguous()
            if rest is not None
            else torch.zeros((num, 0, 3), dtype=torch.float32)
        ),
    }


# ----------------------------------------------------------------------------------------------
# Merging a distributed run's shards (rank 0 writes)


def merge_shards(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Concatenate per-rank parameter dicts in rank order (deterministic: rank 0's Gaussians
    first). Keys: means, scales, quats, opacities, sh0, shN."""
    return {k: torch.cat([s[k].detach().cpu() for s in shards], dim=0) for k in shards[0]}


def gather_params(ctx, params) -> "dict[str, torch.Tensor] | None":
    """Every rank's shard, merged on rank 0 (None on the other ranks). One gather per export."""
    local = {k: v.detach().cpu() for k, v in params.items()}
    if ctx.world_size == 1:
        return local
    from . import exchange

    shards = exchange.gather_to_main(ctx, local)
    return merge_shards(shards) if shards is not None else None


def ply_name(step: int, world_size: int) -> str:
    """``point_cloud_<step>.ply``, or ``..._distributed_merged.ply`` for a multi-rank run (gsplat's names)."""
    return f"point_cloud_{step}_distributed_merged.ply" if world_size > 1 else f"point_cloud_{step}.ply"


def to_export_frame(
    params: dict[str, torch.Tensor], scene_transform: np.ndarray, export_frame: str
) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    """(Gaussians, [4, 4] similarity x_export = S @ x_normalized) of ``--export_frame``:
    "original" undoes the world normalization (``Scene.transform``; frame.to_input_frame),
    "normalized" keeps the trainer's world (S = identity)."""
    if export_frame == "normalized":
        return params, np.eye(4)
    from .frame import to_input_frame

    return to_input_frame(params, scene_transform), np.linalg.inv(np.asarray(scene_transform, dtype=np.float64))


def export_merged(
    shard: "GaussianShard", ctx, cfg, scene_transform: np.ndarray, result_dir: Path, step: int
) -> "dict | None":
    """Rank 0 writes ``<result_dir>/ply/<ply_name>`` of the whole scene (every rank's ``shard``) after ``step`` steps, in the ``--export_frame``; returns the export there,
    dict(step, path, params, to_frame) for :func:`export_formats` (None on other ranks). Every
    rank must call this. With W > 1 the ranks' shards travel to rank 0 one after another, each
    converted on its owner, and are appended to the file as they arrive: rank 0 holds its own
    rows and one other shard's at a time, never the scene (:func:`stream_shards`). Web formats
    (``--export_formats``) need every Gaussian at once: then the scene is gathered on rank 0 once
    and kept in the export's ``params`` (else None)."""
    from .formats import WEB_SUFFIXES

    shard.sync()  # deferred SH Adam steps (--lazy_sh_adam) caught up
    params = shard.params
    path = Path(result_dir) / "ply" / ply_name(step, ctx.world_size)
    web = any(f in WEB_SUFFIXES for f in cfg.outputs.export_formats)
    if ctx.world_size > 1 and not web:
        local = {k: v.detach().cpu() for k, v in params.items()}
        local, to_frame = to_export_frame(local, scene_transform, cfg.outputs.export_frame)
        rows = ply_rows(local["means"], local["scales"], local["quats"], local["opacities"], local["sh0"], local["shN"])
        del local
        if not stream_shards(ctx, rows, path, params["shN"].shape[1]):
            return None
        return dict(step=step, path=path, params=None, to_frame=to_frame)
    merged = gather_params(ctx, params)
    if merged is None:
        return None
    merged, to_frame = to_export_frame(merged, scene_transform, cfg.outputs.export_frame)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_ply(
        path, merged["means"], merged["scales"], merged["quats"], merged["opacities"], merged["sh0"], merged["shN"]
    )
    return dict(step=step, path=path, params=merged if web else None, to_frame=to_frame)


def stream_shards(ctx, rows: np.ndarray, path: Path, num_rest_coeffs: int) -> bool:
    """Every rank's PLY rows [n_r, P] into one file on rank 0, in rank order (the merged file's
    order, as merge_shards), by point-to-point sends: rank 0 writes its own rows, then receives
    and appends rank 1's, rank 2's ... one at a time. Collective; returns True on rank 0."""
    from . import exchange

    counts = [int(n) for n in exchange.gather_metadata(ctx, [rows.shape[0]])[:, 0]]
    if not ctx.is_main:
        exchange.send_rows(ctx, torch.from_numpy(rows), dst=0)
        return False

    def parts():
        yield rows
        for r in range(1, ctx.world_size):
            yield exchange.recv_rows(ctx, counts[r], rows.shape[1], src=r).numpy()

    path.parent.mkdir(parents=True, exist_ok=True)
    write_ply_parts(path, sum(counts), num_rest_coeffs, parts())
    return True


def export_formats(export: "dict | None", cfg, result_dir: Path, training_cameras) -> list:
    """Rank 0, after :func:`export_merged` (no collective): the ``--export_formats`` beyond the PLY
    of ``export`` (None: nothing, as on the other ranks), each an optional output (one warning line
    when it fails; evaluate.optional). Returns the paths written."""
    from .evaluate import optional

    if export is None:
        return []
    return write_formats(cfg.outputs.export_formats, export, result_dir, training_cameras, cfg, run=optional)


def write_formats(names, export: dict, result_dir, training_cameras, cfg, run=None) -> list:
    """Write the formats ``names`` other than "ply" (formats.py) of one export: ``export`` holds
    step, path (the PLY written), params (Gaussians in the export frame) and to_frame ([4, 4],
    x_export = to_frame @ x_normalized); ``training_cameras()`` gives the data.Camera list of
    cameras.json (called only for "inria"). ``run(what, write)`` runs each write (default: call
    it, so errors propagate; the trainer passes evaluate.optional). Returns the paths written."""
    from . import formats

    run = run or (lambda what, write: write())
    written = []
    for fmt in dict.fromkeys(names):  # in order, once each
        if fmt == "inria":
            written.append(
                run(
                    f"Inria layout {Path(result_dir) / 'point_cloud'}",
                    lambda: formats.write_inria_layout(
                        result_dir, export["step"], export["path"], training_cameras(), export["to_frame"], cfg
                    ),
                )
            )
        elif fmt in formats.WEB_SUFFIXES:
            target = formats.web_export_path(export["path"], fmt)
            written.append(
                run(f"{fmt} export {target}", lambda: formats.write_web_format(target, export["params"], fmt))
            )
    return [p for p in written if p is not None]
