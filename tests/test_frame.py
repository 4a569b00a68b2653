"""trainer/frame.py: Gaussians moved by a similarity render the same image from the moved camera;
the real-SH rotation is exact."""

import math

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from splat_train.kernels import reference
from splat_train.trainer import frame
from splat_train.trainer.data.normalize import transform_cameras
from splat_train.trainer.launch import DistContext
from splat_train.trainer.model import activated
from splat_train.trainer.render import CameraBatch, render, rigid_inverse

from scenes import look_at


def _similarity(seed: int, scale: float) -> np.ndarray:
    transform = np.eye(4)
    transform[:3, :3] = scale * Rotation.random(random_state=seed).as_matrix()
    transform[:3, 3] = np.random.default_rng(seed).normal(size=3) * 5
    return transform


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_rotated_sh_coefficients_at_rotated_directions_equal_the_original(degree):
    g = torch.Generator().manual_seed(degree)
    rotation = Rotation.random(random_state=10 + degree).as_matrix()
    coeffs = torch.randn(50, (degree + 1) ** 2, 3, generator=g, dtype=torch.float64)  # [N, K, 3]
    dirs = torch.randn(50, 3, generator=g, dtype=torch.float64)
    rotated = coeffs.clone()
    rotated[:, 1:] = frame.rotate_sh(coeffs[:, 1:], rotation)
    before = reference.spherical_harmonics(degree, dirs, coeffs)
    after = reference.spherical_harmonics(degree, dirs @ torch.from_numpy(rotation).T, rotated)
    assert torch.allclose(before, after, atol=1e-12), (before - after).abs().max()
    assert not torch.allclose(rotated, coeffs)  # the coefficients did change
    # a rotation of the SH space is orthogonal in this orthonormal basis
    for matrix in frame.sh_rotation(rotation, degree):
        np.testing.assert_allclose(matrix @ matrix.T, np.eye(len(matrix)), atol=1e-12)


def _params(num: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        means=(torch.rand(num, 3, generator=g) * 2 - 1) * 0.8,
        quats=torch.randn(num, 4, generator=g) * 2.0,  # raw, unnormalized
        scales=torch.rand(num, 3, generator=g) * 1.5 - 3.5,
        opacities=torch.randn(num, generator=g),
        sh0=torch.randn(num, 1, 3, generator=g) * 0.5,
        shN=torch.randn(num, 15, 3, generator=g) * 0.3,
    )


def _render(params: dict, camtoworld: np.ndarray, K: torch.Tensor, size: int) -> torch.Tensor:
    cams = CameraBatch(rigid_inverse(torch.from_numpy(camtoworld).float()[None]), K[None], size, size)
    with torch.no_grad():
        result = render(activated(params), cams, DistContext(), reference, sh_degree=3)
    return result.colors[0]  # [H, W, 3]


@pytest.mark.parametrize("scale", [0.37, 1.0, 4.2])
def test_the_same_camera_renders_the_same_image_from_both_frames(scale):
    params = _params(200, seed=3)
    transform = _similarity(7, scale)
    camtoworld = np.linalg.inv(look_at([2.5, -1.0, 1.2]).numpy()).astype(np.float64)[None]  # [1, 4, 4]
    K = torch.tensor([[40.0, 0, 24], [0, 40.0, 24], [0, 0, 1]])
    image = _render(params, camtoworld[0], K, 48)
    moved = frame.transform_gaussians(params, transform)
    moved_image = _render(moved, transform_cameras(transform, camtoworld)[0], K, 48)
    assert image.abs().sum() > 10  # the camera sees the Gaussians
    assert not torch.allclose(moved["means"], params["means"])
    assert torch.allclose(image, moved_image, atol=2e-4), (image - moved_image).abs().max()
    # without rotating the SH (only means, quats, scales) the view-dependent colour is wrong
    unrotated = dict(moved, shN=params["shN"])
    assert not torch.allclose(image, _render(unrotated, transform_cameras(transform, camtoworld)[0], K, 48), atol=1e-2)


def test_round_trip_and_parameter_rules():
    params = _params(30, seed=5)
    transform = _similarity(2, 2.5)
    moved = frame.transform_gaussians(params, transform)
    back = frame.to_input_frame(moved, transform)  # the inverse of "normalized = T @ input"
    sign = torch.sign((back["quats"] * params["quats"]).sum(-1, keepdim=True))  # q and -q: one rotation
    back["quats"] = back["quats"] * sign
    for key in params:
        assert torch.allclose(back[key], params[key], atol=1e-5), key
    assert torch.allclose(moved["scales"], params["scales"] + math.log(2.5), atol=1e-6)
    assert torch.allclose(moved["quats"].norm(dim=-1), params["quats"].norm(dim=-1), rtol=1e-6)
    assert torch.equal(moved["opacities"], params["opacities"]) and torch.equal(moved["sh0"], params["sh0"])
    # the identity leaves every value bitwise unchanged
    same = frame.transform_gaussians(params, np.eye(4))
    assert all(torch.equal(same[k], params[k]) for k in params)


def test_rejects_what_is_not_a_similarity():
    with pytest.raises(ValueError, match="proper rotation"):
        frame.decompose_similarity(np.diag([1.0, 1.0, -1.0, 1.0]))
    shear = np.eye(4)
    shear[0, 1] = 0.5
    with pytest.raises(ValueError, match="scaled rotation"):
        frame.decompose_similarity(shear)
