"""Random Gaussian scenes and cameras shared by the tests (not a test module)."""

import math

import torch


def make_scene(seed: int, num_gaussians: int = 301, sh_degree: int = 1):
    g = torch.Generator().manual_seed(seed)
    n = num_gaussians
    params = dict(
        means=(torch.rand(n, 3, generator=g) * 2 - 1) * 0.8,
        quats=torch.randn(n, 4, generator=g),
        scales=torch.exp(torch.rand(n, 3, generator=g) * 1.5 - 3.2),
        opacities=torch.rand(n, generator=g) * 0.8 + 0.1,
        colors=torch.randn(n, (sh_degree + 1) ** 2, 3, generator=g) * 0.4,
    )
    return params


def look_at(eye):
    eye = torch.tensor(eye, dtype=torch.float32)
    fwd = -eye / eye.norm()
    right = torch.linalg.cross(fwd, torch.tensor([0.0, 0.0, 1.0]))
    right = right / right.norm()
    down = torch.linalg.cross(fwd, right)
    c2w = torch.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, down, fwd, eye
    return torch.linalg.inv(c2w)


def make_cameras(sizes):
    """One camera per entry of sizes [(w, h)], on a circle of radius 3, with ground truths."""
    cams = []
    for i, (w, h) in enumerate(sizes):
        a = 2 * math.pi * i / len(sizes)
        viewmat = look_at([3 * math.cos(a), 3 * math.sin(a), 1.0])
        f = 0.9 * max(w, h)
        K = torch.tensor([[f, 0, w / 2], [0, f, h / 2], [0, 0, 1.0]])
        gt = torch.rand(h, w, 3, generator=torch.Generator().manual_seed(100 + i))
        cams.append((viewmat, K, w, h, gt))
    return cams


def add_posed_image(rec, camera, image, w2c) -> None:
    """Add ``camera`` (a pycolmap.Camera) and ``image`` (a pycolmap.Image of that camera) posed by
    ``w2c`` (a pycolmap.Rigid3d, world to camera) to ``rec``, each camera its own trivial rig and
    each image its own frame: pycolmap >= 3.13's add_*_with_trivial_*, or the same rig and frame
    spelled out for pycolmap 3.12 (the GPU machine's wheel)."""
    import pycolmap

    if hasattr(rec, "add_camera_with_trivial_rig"):
        rec.add_camera_with_trivial_rig(camera)
        rec.add_image_with_trivial_frame(image, w2c)
        return
    rec.add_camera(camera)
    rig = pycolmap.Rig(rig_id=camera.camera_id)
    rig.add_ref_sensor(camera.sensor_id)
    rec.add_rig(rig)
    frame = pycolmap.Frame(frame_id=image.image_id, rig_id=camera.camera_id)
    frame.add_data_id(image.data_id)
    frame.rig_from_world = w2c
    rec.add_frame(frame)
    image.frame_id = image.image_id
    rec.add_image(image)
    rec.register_frame(image.image_id)


def write_colmap_scene(root, scene, masks=None):
    """Write a Scene (the synthetic one: in-memory images, SfM points and, when present, each
    camera's point_ids as tracks) as a COLMAP capture under ``root``: images/ (PNG),
    sparse/0 (binary, PINHOLE cameras) and, for the views with an entry in ``masks`` {index: bool
    [H, W]}, masks/<name> (0 / 255 PNG). Returns ``root``."""
    from pathlib import Path

    import imageio.v3 as iio
    import numpy as np
    import pycolmap

    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    rec = pycolmap.Reconstruction()
    for i, cam in enumerate(scene.cameras, start=1):
        K = cam.K
        camera = pycolmap.Camera(
            model="PINHOLE",
            width=cam.width,
            height=cam.height,
            params=[K[0, 0], K[1, 1], K[0, 2], K[1, 2]],
            camera_id=i,
        )
        image = pycolmap.Image(name=cam.name, camera_id=i, image_id=i)
        ids = cam.point_ids if cam.point_ids is not None else np.zeros(0, np.int64)
        image.points2D = pycolmap.Point2DList([pycolmap.Point2D(np.zeros(2)) for _ in ids])
        w2c = pycolmap.Rigid3d(np.linalg.inv(cam.camtoworld.astype(np.float64))[:3, :4])
        add_posed_image(rec, camera, image, w2c)
        iio.imwrite(root / "images" / cam.name, np.asarray(scene.images[i - 1]))
        if masks and (i - 1) in masks:
            (root / "masks").mkdir(exist_ok=True)
            iio.imwrite(root / "masks" / cam.name, masks[i - 1].astype(np.uint8) * 255)
    tracks = {}
    for i, cam in enumerate(scene.cameras, start=1):
        for j, pid in enumerate(cam.point_ids if cam.point_ids is not None else []):
            tracks.setdefault(int(pid), []).append((i, j))
    for pid, xyz in enumerate(scene.points):
        track = pycolmap.Track()
        for image_id, idx in tracks.get(pid, []):
            track.add_element(image_id, idx)
        rec.add_point3D(xyz.astype(np.float64), track, scene.points_rgb[pid])
    (root / "sparse" / "0").mkdir(parents=True, exist_ok=True)
    rec.write_binary(str(root / "sparse" / "0"))
    return root
