"""Camera paths for the trajectory video (``--render_traj_path``): through the training cameras
(interp), an ellipse around them, or a forward-facing spiral; gsplat's examples/datasets/traj.py
choices (themselves mip-NeRF 360's camera_utils), written here for OpenCV axes (x right, y down,
z forward). Every function returns camera-to-world poses [num_frames, 4, 4] float32.
"""

from __future__ import annotations

import numpy as np


def trajectory(path: str, camtoworlds: np.ndarray, num_frames: int, bounds: tuple[float, float]) -> np.ndarray:
    """``--render_traj_path``'s camera-to-world poses [num_frames, 4, 4] (OpenCV axes) from the
    training cameras [C, 4, 4]: "interp" (:func:`trajectory_poses`), "ellipse"
    (:func:`ellipse_poses`) or "spiral" (:func:`spiral_poses`, ``bounds`` = near and far scene
    depths)."""
    if path == "ellipse":
        return ellipse_poses(camtoworlds, num_frames)
    if path == "spiral":
        return spiral_poses(camtoworlds, num_frames, *bounds)
    return trajectory_poses(camtoworlds, num_frames)


def _look(forward: np.ndarray, down: np.ndarray, position: np.ndarray) -> np.ndarray:
    """[4, 4] OpenCV camera-to-world looking along ``forward`` with image-down close to ``down``."""
    from .data.synthetic import look_at

    return look_at(position, position + forward, -np.asarray(down, dtype=np.float64))


def focus_point(camtoworlds: np.ndarray) -> np.ndarray:
    """[3] the point nearest (least squares) to every camera's optical axis (mip-NeRF 360's
    focus_point_fn, which gsplat's ellipse path uses)."""
    dirs, origins = camtoworlds[:, :3, 2:3], camtoworlds[:, :3, 3:4]
    m = np.eye(3) - dirs * np.transpose(dirs, (0, 2, 1))  # projectors orthogonal to each axis
    mt_m = np.transpose(m, (0, 2, 1)) @ m
    return (np.linalg.inv(mt_m.mean(0)) @ (mt_m @ origins).mean(0))[:, 0]


def ellipse_poses(camtoworlds: np.ndarray, num_frames: int) -> np.ndarray:
    """An ellipse in the z plane of the cameras' mean height, around their focus point, its
    half-axes the 90th percentile of the cameras' x and y distances from it, every pose looking at
    the focus point with image-down along the world axis nearest the cameras' mean down (gsplat's
    generate_ellipse_path_z with its defaults). [num_frames, 4, 4] float32."""
    centre = focus_point(camtoworlds)
    positions = camtoworlds[:, :3, 3]
    height = positions[:, 2].mean()
    radii = np.percentile(np.abs(positions[:, :2] - centre[:2]), 90, axis=0)
    mean_down = camtoworlds[:, :3, 1].mean(0)
    axis = int(np.argmax(np.abs(mean_down)))
    down = np.eye(3)[axis] * np.sign(mean_down[axis])
    theta = np.linspace(0, 2 * np.pi, num_frames, endpoint=False)
    poses = [
        _look(centre - p, down, p)
        for p in np.stack(
            [centre[0] + radii[0] * np.cos(theta), centre[1] + radii[1] * np.sin(theta), np.full_like(theta, height)], 1
        )
    ]
    return np.stack(poses).astype(np.float32)


def spiral_poses(
    camtoworlds: np.ndarray, num_frames: int, near: float, far: float, rotations: int = 2, zrate: float = 0.5
) -> np.ndarray:
    """A forward-facing spiral (LLFF / mip-NeRF's generate_spiral_path, as gsplat renders it):
    around the mean camera, radii the 90th percentile of the cameras' offsets from it in its own
    axes, ``rotations`` turns with the depth offset at ``zrate`` of the angle, every pose looking
    at the focus depth 1 / (0.25 / near + 0.75 / far) along the mean camera's axis (in OpenCV axes
    the focus is in front; mip-NeRF's OpenGL convention puts it at -z). [num_frames, 4, 4]."""
    mean = _look(camtoworlds[:, :3, 2].mean(0), camtoworlds[:, :3, 1].mean(0), camtoworlds[:, :3, 3].mean(0))
    local = (np.linalg.inv(mean) @ camtoworlds)[:, :3, 3]  # camera centres in the mean camera's frame
    radii = np.percentile(np.abs(local), 90, axis=0)
    focus = 1.0 / (0.25 / near + 0.75 / far)
    target = mean[:3, :3] @ np.array([0.0, 0.0, focus]) + mean[:3, 3]
    poses = []
    for t in np.linspace(0.0, 2 * np.pi * rotations, num_frames, endpoint=False):
        position = mean[:3, :3] @ (radii * np.array([np.cos(t), -np.sin(t), -np.sin(t * zrate)])) + mean[:3, 3]
        poses.append(_look(target - position, mean[:3, 1], position))
    return np.stack(poses).astype(np.float32)


def trajectory_poses(camtoworlds: np.ndarray, num_frames: int, num_keyframes: int = 8) -> np.ndarray:
    """A smooth path through the training cameras: ``num_keyframes`` cameras evenly spaced in name
    order, positions interpolated linearly and rotations by slerp (scipy), ``num_frames`` poses.

    camtoworlds [C, 4, 4] -> [num_frames, 4, 4]. gsplat renders a spline through its cameras
    (examples/datasets/traj.py); a piecewise path is enough for a progress video.
    """
    from scipy.spatial.transform import Rotation, Slerp

    keys = camtoworlds[np.linspace(0, len(camtoworlds) - 1, min(num_keyframes, len(camtoworlds))).round().astype(int)]
    if len(keys) == 1:
        return np.repeat(keys, num_frames, axis=0)
    t_keys = np.arange(len(keys), dtype=np.float64)
    t = np.linspace(0, len(keys) - 1, num_frames)
    slerp = Slerp(t_keys, Rotation.from_matrix(keys[:, :3, :3]))
    poses = np.tile(np.eye(4), (num_frames, 1, 1))
    poses[:, :3, :3] = slerp(t).as_matrix()
    for axis in range(3):
        poses[:, axis, 3] = np.interp(t, t_keys, keys[:, axis, 3])
    return poses.astype(np.float32)
