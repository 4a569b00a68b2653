"""A city-like synthetic scene: a large-scene benchmark whose ground truth is a known model.

A grid of streets and blocks (``BLOCKS`` x ``BLOCKS`` blocks of ``BLOCK_PITCH`` metres, roads with
lane markings and crosswalks, sidewalks, lots with buildings, plazas, lawns and parks; trees and
parked cars) covered with small flat Gaussians: each lies on a surface (its thin axis along the
normal), opacities high, coloured by a pattern of its surface (facades with floors of windows,
roofs with a parapet, paving joints). Cameras are street-level (on a road, looking along it or at
the facades, ``STREET_FOV`` degrees across) and aerial (oblique views of a part of the city from
95-125 m up, ``AERIAL_FOV`` degrees). Everything farther than ``VIEW_DISTANCE`` from a camera is
beyond its far plane, so each camera's projection keeps a few percent of the Gaussians (their
share per camera is ``Scene.visible_fraction``), as in the large captures the trainer is for.

The ground truth is rendered from the Gaussians at SH degree 0 over a black background (gsplat's
CUDA ops on a GPU, kernels/reference.py on the CPU), with the trainer's near and far planes, so a
perfect model exists: the same Gaussians rendered by the trainer reproduce it. The "SfM points"
are a random subset of the true centres, each moved by a normal jitter of half the local spacing
of the Gaussians, with perturbed colours (as data/synthetic.py does for the orbit scene).

Units are metres (the trainer's scene units), z up, the city centred at the origin. The
layout and cameras come from ``numpy.random.default_rng(seed)`` and do not depend on the device
or the number of Gaussians; the Gaussians come from a torch generator on the device they are built
on (the same seed gives the same scene on a device type; CPU and CUDA streams differ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .images import Camera, Scene
from .synthetic import look_at

BLOCKS = 12  # blocks along each axis
BLOCK_PITCH = 100.0  # street centreline to street centreline, m
ROAD_HALF = 7.0  # half the road's width, m (two lanes and two parking lanes)
SIDEWALK = 3.0  # sidewalk width, m
VIEW_DISTANCE = 350.0  # the far plane, m: what a camera of this scene sees
STREET_FOV = 75.0  # horizontal field of view of the street-level cameras, degrees
AERIAL_FOV = 60.0  # horizontal field of view of the aerial cameras, degrees
SIGMA_PER_SPACING = 0.65  # in-plane standard deviation of a Gaussian / the spacing of its surface's Gaussians
THIN = 0.1  # standard deviation along the normal / in-plane standard deviation

# kinds of primitive; every kind is a rectangle but CANOPY (a sphere)
FACADE, ROOF, ROAD, SIDEWALK_KIND, PLAZA, GRASS, CAR, TRUNK, CANOPY = range(9)
KINDS = ("facade", "roof", "road", "sidewalk", "plaza", "grass", "car", "trunk", "canopy")


@dataclass
class Layout:
    """The city's primitives, P of them (float64 numpy, metres).

    A rectangle is ``origin + a * edge_u + b * edge_v`` for a, b in [0, 1]; its pattern coordinates
    are ``st0 + (a |edge_u|, b |edge_v|)`` on a surface of ``size`` (a facade cut into pieces keeps
    its windows aligned). A sphere (CANOPY) has its centre in ``origin`` and its radius in
    ``edge_u[:, 0]``. ``pattern`` holds per-kind parameters (FACADE: window period across,
    floor height, window width and height as fractions of them; ROAD: the block pitch).
    ``group`` numbers the building of a facade (lit windows differ between buildings).
    """

    kind: np.ndarray  # [P] int64
    origin: np.ndarray  # [P, 3]
    edge_u: np.ndarray  # [P, 3]
    edge_v: np.ndarray  # [P, 3]
    st0: np.ndarray  # [P, 2]
    size: np.ndarray  # [P, 2]
    colour: np.ndarray  # [P, 3] in [0, 1]
    accent: np.ndarray  # [P, 3] in [0, 1]
    pattern: np.ndarray  # [P, 4]
    group: np.ndarray  # [P] int64
    half_extent: float  # the city spans [-half_extent, half_extent]^2

    def area(self) -> np.ndarray:
        """[P] surface area of each primitive, m^2."""
        rect = np.linalg.norm(np.cross(self.edge_u, self.edge_v), axis=1)
        return np.where(self.kind == CANOPY, 4.0 * math.pi * self.edge_u[:, 0] ** 2, rect)


class _Builder:
    """Collects primitives row by row; :meth:`layout` cuts long rectangles into near-square pieces."""

    FIELDS = ("kind", "origin", "edge_u", "edge_v", "st0", "colour", "accent", "pattern", "group")

    def __init__(self):
        self.rows: list[tuple] = []

    def rect(self, kind, origin, edge_u, edge_v, colour, accent=(0, 0, 0), pattern=(0, 0, 0, 0), group=-1, st=(0, 0)):
        """The rectangle ``origin + a edge_u + b edge_v`` (a, b in [0, 1]) whose origin has
        pattern coordinates ``st``."""
        self.rows.append((kind, origin, edge_u, edge_v, st, colour, accent, pattern, group))

    def sphere(self, centre, radius, colour):
        self.rows.append((CANOPY, centre, (radius, 0, 0), (0, 0, 0), (0, 0), colour, (0, 0, 0), (0, 0, 0, 0), -1))

    def box(self, kind, lo, hi, colour, accent=(0, 0, 0), pattern=(0, 0, 0, 0), group=-1):
        """The four walls of the box [lo, hi] (x, y, z corners); a wall's pattern coordinates run
        along it from its left corner (s) and up from the bottom (t)."""
        (x0, y0, z0), (x1, y1, z1) = lo, hi
        corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
        for (ax, ay), (bx, by) in zip(corners, corners[1:] + corners[:1]):
            self.rect(kind, (ax, ay, z0), (bx - ax, by - ay, 0), (0, 0, z1 - z0), colour, accent, pattern, group)

    def layout(self, half_extent: float) -> Layout:
        """The rows as arrays, every rectangle but a trunk's walls cut into pieces of aspect at
        most 2 (the low-discrepancy placement of :func:`city_gaussians` spaces points evenly in
        a near-square); a piece keeps its rectangle's pattern coordinates and ``size``."""
        cols = {k: np.asarray(v, dtype=np.float64) for k, v in zip(self.FIELDS, zip(*self.rows))}
        kind = cols["kind"].astype(np.int64)
        lu, lv = np.linalg.norm(cols["edge_u"], axis=1), np.linalg.norm(cols["edge_v"], axis=1)
        keep = (kind == CANOPY) | ((lu > 1e-6) & (lv > 1e-6))
        cut = (kind != CANOPY) & (kind != TRUNK) & keep
        nu = np.where(cut, np.maximum(1, np.round(lu / np.maximum(lv, 1e-9))), 1).astype(np.int64)
        nv = np.where(cut, np.maximum(1, np.round(lv / np.maximum(lu, 1e-9))), 1).astype(np.int64)
        pieces = np.where(keep, nu * nv, 0)
        row = np.repeat(np.arange(len(kind)), pieces)
        k = np.arange(len(row)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        i, j = k // nv[row], k % nv[row]
        fu, fv = (i / nu[row])[:, None], (j / nv[row])[:, None]
        eu, ev = cols["edge_u"][row], cols["edge_v"][row]
        return Layout(
            kind=kind[row],
            origin=cols["origin"][row] + eu * fu + ev * fv,
            edge_u=eu / nu[row, None],
            edge_v=ev / nv[row, None],
            st0=cols["st0"][row] + np.stack([lu[row] * fu[:, 0], lv[row] * fv[:, 0]], axis=1),
            size=np.stack([lu[row], lv[row]], axis=1),
            colour=cols["colour"][row],
            accent=cols["accent"][row],
            pattern=cols["pattern"][row],
            group=cols["group"].astype(np.int64)[row],
            half_extent=half_extent,
        )


WALLS = np.array([[0.82, 0.76, 0.64], [0.66, 0.34, 0.26], [0.78, 0.78, 0.76], [0.55, 0.56, 0.58], [0.88, 0.85, 0.78]])
GLASS = np.array([[0.16, 0.22, 0.30], [0.22, 0.30, 0.34], [0.12, 0.14, 0.18]])
GREEN = np.array([0.28, 0.45, 0.20])


def _building(b: _Builder, rng, lo, hi, group: int) -> None:
    """A building on the footprint [lo, hi] (x, y) of a random height (mostly 8-25 m, a few
    towers up to 70 m): walls with floors of windows, a flat roof with a parapet."""
    u = rng.random()
    height = rng.uniform(8, 25) if u < 0.7 else rng.uniform(25, 45) if u < 0.95 else rng.uniform(45, 70)
    wall = np.clip(WALLS[rng.integers(len(WALLS))] + rng.normal(0, 0.04, 3), 0, 1)
    glass = GLASS[rng.integers(len(GLASS))]
    pattern = (rng.uniform(2.5, 4.0), rng.uniform(3.0, 3.8), rng.uniform(0.45, 0.7), rng.uniform(0.45, 0.65))
    b.box(FACADE, (lo[0], lo[1], 0.0), (hi[0], hi[1], height), wall, glass, pattern, group)
    b.rect(ROOF, (lo[0], lo[1], height), (hi[0] - lo[0], 0, 0), (0, hi[1] - lo[1], 0), (0.32, 0.32, 0.34), 0.8 * wall)


def _tree(b: _Builder, rng, xy) -> None:
    """A trunk (four thin walls) under a spherical canopy."""
    radius, bottom, w = rng.uniform(1.8, 3.0), rng.uniform(3.2, 4.2), 0.2
    b.box(TRUNK, (xy[0] - w, xy[1] - w, 0.0), (xy[0] + w, xy[1] + w, bottom + 0.5), (0.36, 0.26, 0.18))
    b.sphere((xy[0], xy[1], bottom + radius), radius, np.clip(GREEN * 0.9 + rng.normal(0, 0.04, 3), 0, 1))


def _lot(b: _Builder, rng, lo, hi, group: int) -> None:
    """One lot of a block: a park (lawn and trees, one lot in ten), or a building set back 2-5 m
    from the lot's edges on paving or lawn."""
    if rng.random() < 0.1:
        b.rect(GRASS, (lo[0], lo[1], 0), (hi[0] - lo[0], 0, 0), (0, hi[1] - lo[1], 0), GREEN)
        for _ in range(int((hi[0] - lo[0]) * (hi[1] - lo[1]) / 150)):
            _tree(b, rng, (rng.uniform(lo[0] + 3, hi[0] - 3), rng.uniform(lo[1] + 3, hi[1] - 3)))
        return
    paved = rng.random() < 0.6
    kind, colour, accent = (PLAZA, (0.62, 0.60, 0.56), (0.52, 0.50, 0.47)) if paved else (GRASS, GREEN, GREEN)
    m = rng.uniform(2.0, 5.0, 4)  # setbacks: left, right, bottom, top
    fx0, fx1, fy0, fy1 = lo[0] + m[0], hi[0] - m[1], lo[1] + m[2], hi[1] - m[3]
    _building(b, rng, (fx0, fy0), (fx1, fy1), group)
    for x0, y0, x1, y1 in (
        (lo[0], lo[1], hi[0], fy0),
        (lo[0], fy1, hi[0], hi[1]),
        (lo[0], fy0, fx0, fy1),
        (fx1, fy0, hi[0], fy1),
    ):
        b.rect(kind, (x0, y0, 0), (x1 - x0, 0, 0), (0, y1 - y0, 0), colour, accent, st=(x0, y0))


def _car(b: _Builder, rng, centre, along_x: bool) -> None:
    """A parked car: a box of a random colour, a band of windows along its sides above 0.75 m."""
    length, width, z0, z1 = 4.4, 1.8, 0.25, 1.45
    hx, hy = (length / 2, width / 2) if along_x else (width / 2, length / 2)
    body = np.clip(rng.random(3) ** 1.5, 0.05, 0.95)
    lo, hi = (centre[0] - hx, centre[1] - hy, z0), (centre[0] + hx, centre[1] + hy, z1)
    b.box(CAR, lo, hi, body, (0.10, 0.12, 0.15), (0.75, 0, 0, 0))
    b.rect(CAR, (lo[0], lo[1], z1), (2 * hx, 0, 0), (0, 2 * hy, 0), body)


def _street(b: _Builder, rng, c: float, along_x: bool, lo: float, hi: float) -> None:
    """The road of one street (centreline at ``c`` across, from ``lo`` to ``hi`` along): asphalt
    with a dashed centre line and crosswalks at the crossings, parked cars on both sides."""
    half = BLOCKS * BLOCK_PITCH / 2
    origin, edge_u, edge_v = (
        ((lo, c - ROAD_HALF, 0.0), (hi - lo, 0.0, 0.0), (0.0, 2 * ROAD_HALF, 0.0))
        if along_x
        else ((c + ROAD_HALF, lo, 0.0), (0.0, hi - lo, 0.0), (-2 * ROAD_HALF, 0.0, 0.0))
    )
    # s counts from the city's first crossing, so the crossings are at multiples of the pitch
    b.rect(
        ROAD, origin, edge_u, edge_v, (0.17, 0.17, 0.18), (0.85, 0.85, 0.80), (BLOCK_PITCH, 0, 0, 0), st=(lo + half, 0)
    )
    for side in (-1, 1):
        s = lo + rng.uniform(0, 8)
        while s < hi - 5:
            d = (s + half) % BLOCK_PITCH
            if min(d, BLOCK_PITCH - d) > 14 and rng.random() < 0.35:
                lateral = c + side * (ROAD_HALF - 1.4)
                _car(b, rng, (s, lateral) if along_x else (lateral, s), along_x)
            s += rng.uniform(6.5, 9.0)


def _block(b: _Builder, rng, x0: float, y0: float, group: int) -> int:
    """The block whose streets' centrelines cross at (x0, y0) and (x0 + pitch, y0 + pitch): a
    sidewalk ring with street trees, inside it 1-3 x 1-3 lots. Returns the next building number."""
    lo, hi = np.array([x0, y0]) + ROAD_HALF, np.array([x0, y0]) + BLOCK_PITCH - ROAD_HALF
    ilo, ihi = lo + SIDEWALK, hi - SIDEWALK
    grey, joint = (0.58, 0.58, 0.57), (0.45, 0.45, 0.45)
    w, inner = hi[0] - lo[0], ihi[1] - ilo[1]
    for origin, eu, ev in (
        ((lo[0], lo[1]), (w, 0), (0, SIDEWALK)),
        ((lo[0], ihi[1]), (w, 0), (0, SIDEWALK)),
        ((lo[0], ilo[1]), (SIDEWALK, 0), (0, inner)),
        ((ihi[0], ilo[1]), (SIDEWALK, 0), (0, inner)),
    ):
        b.rect(SIDEWALK_KIND, (*origin, 0), (*eu, 0), (*ev, 0), grey, joint, st=origin)
    for t in np.arange(lo[0] + 4, hi[0] - 2, 11.0):
        for xy in (
            (t, lo[1] + SIDEWALK / 2),
            (t, hi[1] - SIDEWALK / 2),
            (lo[0] + SIDEWALK / 2, t),
            (hi[0] - SIDEWALK / 2, t),
        ):
            if rng.random() < 0.4:
                _tree(b, rng, xy)
    nx, ny = rng.integers(1, 4, 2)
    xs, ys = np.linspace(ilo[0], ihi[0], nx + 1), np.linspace(ilo[1], ihi[1], ny + 1)
    for i in range(nx):
        for j in range(ny):
            _lot(b, rng, (xs[i], ys[j]), (xs[i + 1], ys[j + 1]), group)
            group += 1
    return group


def city_layout(seed: int = 0) -> Layout:
    """The city's primitives, from ``numpy.random.default_rng(seed)``: BLOCKS + 1 streets along x
    and along y, BLOCK_PITCH apart (the outermost ones on the city's edge; those along y stop at
    those along x, so no ground is covered twice), and the blocks between them (:func:`_block`)."""
    rng = np.random.default_rng(seed)
    b = _Builder()
    half = BLOCKS * BLOCK_PITCH / 2
    lines = -half + BLOCK_PITCH * np.arange(BLOCKS + 1)
    for c in lines:
        _street(b, rng, c, True, -half - ROAD_HALF, half + ROAD_HALF)
        for lo, hi in zip(lines[:-1], lines[1:]):
            _street(b, rng, c, False, lo + ROAD_HALF, hi - ROAD_HALF)
    group = 0
    for x0 in lines[:-1]:
        for y0 in lines[:-1]:
            group = _block(b, rng, x0, y0, group)
    return b.layout(half + ROAD_HALF)


def allocate(area: np.ndarray, num_gaussians: int) -> np.ndarray:
    """int64 [P] Gaussians per primitive, proportional to ``area`` (an even density over the
    city), summing to ``num_gaussians``: the floors of the shares, the rest to the largest
    remainders (Hamilton's method; ties to the lower index)."""
    share = area / area.sum() * num_gaussians
    counts = np.floor(share).astype(np.int64)
    rest = num_gaussians - int(counts.sum())
    counts[np.argsort(-(share - counts), kind="stable")[:rest]] += 1
    return counts


_FIX = 2.0**32
_R2 = (1.0 / 1.32471795724474602596, 1.0 / 1.32471795724474602596**2)  # Roberts' R2 sequence (plastic number)
_GOLDEN = 0.61803398874989484820


def _fraction(j: torch.Tensor, alpha: float, offset: torch.Tensor) -> torch.Tensor:
    """float32 frac(offset + j alpha) for int64 j below 2^31, in 32-bit fixed point (float32 would
    lose the fraction of j alpha once j is in the thousands)."""
    value = j * int(round(alpha * _FIX)) + (offset * _FIX).long()
    return (value & 0xFFFFFFFF).float() / _FIX


def _quat_from_normal(n: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """[N, 4] (w, x, y, z) unit quaternions of the rotation that takes local z to ``n`` [N, 3]
    (unit; flipped into the upper half space, which a flat Gaussian does not tell apart), after a
    turn by ``angle`` [N] (radians) about local z: q(z -> n) * q_z(angle), where q(z -> n) =
    normalize(1 + z.n, z x n) is the half-way quaternion."""
    n = torch.where(n[:, 2:3] < 0, -n, n)
    align = torch.stack([1.0 + n[:, 2], -n[:, 1], n[:, 0], torch.zeros_like(n[:, 0])], dim=1)
    w1, x1, y1, z1 = (align / align.norm(dim=1, keepdim=True)).unbind(1)
    w2, z2 = torch.cos(angle / 2), torch.sin(angle / 2)
    return torch.stack([w1 * w2 - z1 * z2, x1 * w2 + y1 * z2, y1 * w2 - x1 * z2, w1 * z2 + z1 * w2], dim=1)


def _colours(kind, s, t, prim: dict, ids: torch.Tensor) -> torch.Tensor:
    """[N, 3] colour of each Gaussian from its primitive's pattern at its pattern coordinates (s, t)
    in metres (see :class:`Layout`): FACADE floors of windows (a shop front on the ground floor,
    one window in eight lit), ROOF a parapet band, ROAD a dashed centre line and crosswalks,
    SIDEWALK joints, PLAZA a checkerboard of 2 m slabs, CAR a band of windows; others plain."""
    colour, accent, pattern, size = (prim[k][ids] for k in ("colour", "accent", "pattern", "size"))
    ps, pt, fw, fh = pattern.unbind(1)
    width, height = size.unbind(1)
    frac_s, frac_t = torch.frac(s / ps.clamp_min(1e-3)), torch.frac(t / pt.clamp_min(1e-3))
    col, floor = torch.floor(s / ps.clamp_min(1e-3)).long(), torch.floor(t / pt.clamp_min(1e-3)).long()
    pane = ((frac_s - 0.5).abs() < fw / 2) & ((frac_t - 0.5).abs() < fh / 2) & ((floor + 1) * pt < height - 0.3)
    shop = (floor == 0) & ((frac_t - 0.5).abs() < 0.3) & ((frac_s - 0.5).abs() < 0.42)
    inside = (s > 0.6) & (s < width - 0.6)
    window = (kind == FACADE) & inside & ((pane & (floor >= 1)) | shop)
    lit = ((prim["group"][ids] * 73856093) ^ (col * 19349663) ^ (floor * 83492791)) & 0x7FFFFFFF
    glass = torch.where((lit % 8 == 0)[:, None], torch.tensor([0.95, 0.85, 0.55], device=s.device), accent)
    border = (s < 0.8) | (s > width - 0.8) | (t < 0.8) | (t > height - 0.8)
    crossing = torch.remainder(s, ps.clamp_min(1e-3))
    crossing = torch.minimum(crossing, ps - crossing)  # distance to the nearest crossing street's centreline
    dashes = ((t - ROAD_HALF).abs() < 0.12) & (torch.frac(s / 9.0) < 0.5) & (crossing > ROAD_HALF + SIDEWALK + 1)
    zebra = (
        (crossing > ROAD_HALF + 0.5)
        & (crossing < ROAD_HALF + SIDEWALK)
        & (torch.frac(t) < 0.5)
        & (t > 1)
        & (t < 2 * ROAD_HALF - 1)
    )
    joints = (torch.frac(s / 1.5) < 0.06) | (torch.frac(t / 1.5) < 0.06)
    slabs = (torch.floor(s / 2) + torch.floor(t / 2)).long() % 2 == 1
    second = (
        window
        | ((kind == ROOF) & border)
        | ((kind == ROAD) & (dashes | zebra))
        | ((kind == SIDEWALK_KIND) & joints)
        | ((kind == PLAZA) & slabs)
        | ((kind == CAR) & (ps > 0) & (t > ps))
    )
    return torch.where(second[:, None], torch.where(window[:, None], glass, accent), colour)


def city_gaussians(
    layout: Layout, num_gaussians: int, seed: int = 0, device: str = "cpu", chunk: int = 1 << 22
) -> dict[str, torch.Tensor]:
    """The Gaussians of ``layout`` on ``device``: float32 means [N, 3] (m), quats [N, 4] (w, x, y,
    z, unit), scales [N, 3] (m; the third along the surface normal), opacities [N], colors [N, 3]
    (RGB in [0, 1]) and spacing [N] (m: the distance between neighbouring Gaussians of the
    surface, sqrt(area / count)).

    Each primitive gets :func:`allocate`'s share; on a rectangle the Gaussians sit at the points
    of Roberts' R2 low-discrepancy sequence (shifted by a random offset per primitive), on a
    sphere on a Fibonacci lattice, so a surface is covered evenly without holes. In-plane
    standard deviations SIGMA_PER_SPACING x spacing x U(0.85, 1.2) each, THIN times their mean
    along the normal, a random turn about the normal, opacity U(0.85, 0.99), colour
    :func:`_colours` + N(0, 0.025) (0.06 on lawns and canopies), clamped to [0, 1]. Vectorized
    over ``chunk`` Gaussians at a time (a constant peak of temporaries); the random numbers come
    from ``torch.Generator(device).manual_seed(seed)`` in chunk order.
    """
    area = layout.area()
    counts = allocate(area, num_gaussians)
    offsets = np.random.default_rng((seed, 2)).random((len(area), 2))
    normal = np.cross(layout.edge_u, layout.edge_v)
    normal /= np.maximum(np.linalg.norm(normal, axis=1, keepdims=True), 1e-12)
    lengths = np.stack([np.linalg.norm(layout.edge_u, axis=1), np.linalg.norm(layout.edge_v, axis=1)], axis=1)

    def dev(a, dtype=torch.float32):
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

    prim = dict(
        kind=dev(layout.kind, torch.int64),
        origin=dev(layout.origin),
        edge_u=dev(layout.edge_u),
        edge_v=dev(layout.edge_v),
        normal=dev(normal),
        lengths=dev(lengths),
        st0=dev(layout.st0),
        size=dev(layout.size),
        colour=dev(layout.colour),
        accent=dev(layout.accent),
        pattern=dev(layout.pattern),
        group=dev(layout.group, torch.int64),
        offset=dev(offsets, torch.float64),
        spacing=dev(np.sqrt(area / np.maximum(counts, 1))),
        count=dev(counts, torch.int64),
        start=dev(np.cumsum(counts) - counts, torch.int64),
    )
    # one past each primitive's last Gaussian: a sorted search finds the primitive of a Gaussian
    bounds = torch.as_tensor(np.cumsum(counts), device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {
        k: torch.empty((num_gaussians, d) if d else (num_gaussians,), device=device)
        for k, d in (("means", 3), ("quats", 4), ("scales", 3), ("opacities", 0), ("colors", 3), ("spacing", 0))
    }
    for begin in range(0, num_gaussians, chunk):
        end = min(begin + chunk, num_gaussians)
        idx = torch.arange(begin, end, device=device)
        ids = torch.searchsorted(bounds, idx, right=True)
        j = idx - prim["start"][ids]
        a = _fraction(j, _R2[0], prim["offset"][ids, 0])
        b = _fraction(j, _R2[1], prim["offset"][ids, 1])
        kind = prim["kind"][ids]
        sphere = kind == CANOPY
        # Fibonacci lattice on a sphere: z evenly spaced, longitude advancing by the golden angle
        z = 1.0 - 2.0 * (j.float() + 0.5) / prim["count"][ids].float()
        phi = 2.0 * math.pi * _fraction(j, _GOLDEN, prim["offset"][ids, 0])
        ring = torch.sqrt((1.0 - z * z).clamp_min(0.0))
        radial = torch.stack([ring * torch.cos(phi), ring * torch.sin(phi), z], dim=1)
        flat = prim["origin"][ids] + a[:, None] * prim["edge_u"][ids] + b[:, None] * prim["edge_v"][ids]
        radius = prim["edge_u"][ids, 0:1]
        out["means"][begin:end] = torch.where(sphere[:, None], prim["origin"][ids] + radius * radial, flat)
        normals = torch.where(sphere[:, None], radial, prim["normal"][ids])
        r = torch.rand(len(idx), 4, generator=gen, device=device)
        out["quats"][begin:end] = _quat_from_normal(normals, 2.0 * math.pi * r[:, 0])
        sigma = SIGMA_PER_SPACING * prim["spacing"][ids, None] * (0.85 + 0.35 * r[:, 1:3])
        out["scales"][begin:end] = torch.cat([sigma, THIN * sigma.mean(dim=1, keepdim=True)], dim=1)
        out["opacities"][begin:end] = 0.85 + 0.14 * r[:, 3]
        s = prim["st0"][ids, 0] + a * prim["lengths"][ids, 0]
        t = prim["st0"][ids, 1] + b * prim["lengths"][ids, 1]
        noise = torch.where((kind == GRASS) | sphere, 0.06, 0.025)[:, None]
        jitter = torch.randn(len(idx), 3, generator=gen, device=device) * noise
        out["colors"][begin:end] = (_colours(kind, s, t, prim, ids) + jitter).clamp(0.0, 1.0)
        out["spacing"][begin:end] = prim["spacing"][ids]
    return out


def _intrinsics(fov_degrees: float, width: int, height: int) -> np.ndarray:
    """[3, 3] pinhole K of a horizontal field of view ``fov_degrees``, square pixels, centred."""
    focal = 0.5 * width / math.tan(math.radians(fov_degrees) / 2)
    return np.array([[focal, 0, width / 2], [0, focal, height / 2], [0, 0, 1]], dtype=np.float32)


def _looking(eye: np.ndarray, yaw: float, pitch: float) -> np.ndarray:
    """Camera-to-world [4, 4] (OpenCV axes) at ``eye`` looking along compass angle ``yaw`` from +x
    towards +y, ``pitch`` above the horizon (radians)."""
    forward = np.array([math.cos(pitch) * math.cos(yaw), math.cos(pitch) * math.sin(yaw), math.sin(pitch)])
    return look_at(eye, eye + forward, np.array([0.0, 0.0, 1.0]))


def street_camera(rng, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """(c2w, K) of a street-level camera: on an inner street, 1.5-2.2 m up, within 2.5 m of the
    centreline (clear of the parked cars and trees), looking along the street (half of them,
    within about 9 degrees) or at one of its sides (within 29 degrees of square on), 2-11
    degrees above the horizon; STREET_FOV across."""
    half = BLOCKS * BLOCK_PITCH / 2
    along_x = bool(rng.integers(2))
    c = -half + BLOCK_PITCH * rng.integers(1, BLOCKS)
    s, lateral, up = rng.uniform(-half + 30, half - 30), rng.uniform(-2.5, 2.5), rng.uniform(1.5, 2.2)
    eye = np.array([s, c + lateral, up] if along_x else [c + lateral, s, up])
    street = 0.0 if along_x else math.pi / 2
    if rng.random() < 0.5:
        yaw = street + math.pi * rng.integers(2) + rng.normal(0, 0.15)
    else:
        yaw = street + math.pi * (rng.integers(2) - 0.5) + rng.uniform(-0.5, 0.5)
    return _looking(eye, yaw, rng.uniform(0.03, 0.2)), _intrinsics(STREET_FOV, width, height)


def aerial_camera(rng, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """(c2w, K) of an aerial camera: 95-125 m up, its optical axis on a ground point in the
    middle 60% of the city (each way), any heading, its top edge 22-40 degrees below the horizon
    (so the farthest ground it sees is within 335 m, inside VIEW_DISTANCE); AERIAL_FOV across."""
    half = BLOCKS * BLOCK_PITCH / 2
    K = _intrinsics(AERIAL_FOV, width, height)
    half_vertical = math.atan(0.5 * height / K[1, 1])
    pitch = min(half_vertical + math.radians(rng.uniform(22, 40)), math.radians(85))
    target = np.array([*rng.uniform(-0.6 * half, 0.6 * half, 2), 0.0])
    altitude, yaw = rng.uniform(95, 125), rng.uniform(0, 2 * math.pi)
    forward = np.array([math.cos(pitch) * math.cos(yaw), math.cos(pitch) * math.sin(yaw), -math.sin(pitch)])
    eye = target - forward * altitude / math.sin(pitch)
    return look_at(eye, target, np.array([0.0, 0.0, 1.0])), K


def city_cameras(num_cameras: int, width: int, height: int, seed: int = 0) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(kind, c2w [4, 4], K [3, 3]) float32 of each camera, from ``numpy.random.default_rng((seed, 1))``:
    every third one (index 2 mod 3) aerial, the others street-level, so every eighth camera
    (the default test split) holds both kinds."""
    rng = np.random.default_rng((seed, 1))
    out = []
    for i in range(num_cameras):
        kind = "aerial" if i % 3 == 2 else "street"
        c2w, K = (aerial_camera if kind == "aerial" else street_camera)(rng, width, height)
        out.append((kind, c2w.astype(np.float32), K))
    return out


def render_view(
    ops, gaussians: dict, viewmat: torch.Tensor, K: torch.Tensor, width: int, height: int, near: float, far: float
):
    """Render one camera (SH degree 0: the colours as given, black background) with ``ops``
    (gsplat.cuda._wrapper or kernels.reference: projection with the opacity-aware bounding box,
    tile intersection, rasterization, 16-pixel tiles, as the trainer renders). Returns (image
    [H, W, 3] float, the number of Gaussians the projection kept: radii > 0)."""
    means, quats, scales, opacities = (gaussians[k] for k in ("means", "quats", "scales", "opacities"))
    radii, means2d, depths, conics, _ = ops.fully_fused_projection(
        means, None, quats, scales, viewmat[None], K[None], width, height,
        near_plane=near, far_plane=far, opacities=opacities,
    )  # fmt: skip
    tw, th = math.ceil(width / 16), math.ceil(height / 16)
    _, isect_ids, flatten_ids = ops.isect_tiles(means2d, radii, depths, 16, tw, th)
    offsets = ops.isect_offset_encode(isect_ids, 1, tw, th)
    colors, opac = gaussians["colors"][None].contiguous(), opacities[None].contiguous()
    image, _ = ops.rasterize_to_pixels(means2d, conics, colors, opac, width, height, 16, offsets, flatten_ids)
    return image[0], int((radii[0] > 0).all(-1).sum())


def make_city_scene(
    num_gaussians: int = 20_000,
    num_cameras: int = 16,
    width: int = 256,
    height: int = 144,
    seed: int = 0,
    device: str = "cpu",
    num_points: Optional[int] = None,
    near_plane: float = 0.01,
    far_plane: float = VIEW_DISTANCE,
) -> Scene:
    """The city scene: :func:`city_layout`, ``num_gaussians`` Gaussians on it
    (:func:`city_gaussians`), :func:`city_cameras` with ``width`` x ``height`` images rendered
    from them between ``near_plane`` and ``far_plane`` (scene units; the trainer's planes must
    be the same for its perfect model to reproduce them) on ``device`` (gsplat's CUDA ops on
    "cuda", the reference renderer on "cpu"). ``num_points`` SfM stand-in points (default: one
    per Gaussian), a random subset of the centres in random order, each jittered by N(0, (spacing
    / 2)^2) per axis, colours + N(0, 0.1^2). ``Scene.visible_fraction``: each camera's share of
    the Gaussians its projection keeps. Deterministic in ``seed`` on a device type.

    Raises ValueError when ``num_gaussians`` < 1, ``num_points`` is outside [1, num_gaussians], or
    the image is smaller than 16 pixels either way.
    """
    import importlib

    if num_gaussians < 1:
        raise ValueError(f"the city needs at least one Gaussian, got {num_gaussians}")
    num_points = num_gaussians if num_points is None else num_points
    if not 1 <= num_points <= num_gaussians:
        raise ValueError(f"the city's SfM points must number 1 to {num_gaussians} (its Gaussians), got {num_points}")
    if min(width, height) < 16:
        raise ValueError(f"the city's images must be at least 16 pixels each way, got {width}x{height}")
    ops = importlib.import_module(
        "gsplat.cuda._wrapper" if device.startswith("cuda") else "splat_train.kernels.reference"
    )  # deferred: the renderer is only needed to build the images
    gaussians = city_gaussians(city_layout(seed), num_gaussians, seed, device)
    cameras, images, visible = [], [], []
    for i, (kind, c2w, K) in enumerate(city_cameras(num_cameras, width, height, seed)):
        viewmat = torch.from_numpy(np.linalg.inv(c2w)).float().to(device)
        with torch.no_grad():
            image, kept = render_view(
                ops, gaussians, viewmat, torch.from_numpy(K).to(device), width, height, near_plane, far_plane
            )
        images.append((image.clamp(0, 1).cpu().numpy() * 255.0 + 0.5).astype(np.uint8))
        visible.append(kept / num_gaussians)
        cameras.append(
            Camera(
                name=f"city_{i:03d}_{kind}.png",
                image_path=None,  # type: ignore[arg-type]  # no file: the pixels are rendered
                camtoworld=c2w,
                K=K,
                width=width,
                height=height,
            )
        )
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    ids = torch.randperm(num_gaussians, generator=gen, device=device)[:num_points]
    jitter = torch.randn(num_points, 3, generator=gen, device=device) * (0.5 * gaussians["spacing"][ids, None])
    rgb = gaussians["colors"][ids] + 0.1 * torch.randn(num_points, 3, generator=gen, device=device)
    points = (gaussians["means"][ids] + jitter).cpu().numpy()
    points_rgb = (rgb.clamp(0, 1) * 255).to(torch.uint8).cpu().numpy()
    del gaussians
    centres = np.stack([c.camtoworld[:3, 3] for c in cameras])
    return Scene(
        cameras=cameras,
        points=points,
        points_rgb=points_rgb,
        scene_scale=float(np.linalg.norm(centres - centres.mean(0), axis=1).max()),
        transform=np.eye(4, dtype=np.float32),
        source="synthetic",
        images=images,
        visible_fraction=np.asarray(visible),
    )
