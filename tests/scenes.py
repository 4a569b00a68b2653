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
