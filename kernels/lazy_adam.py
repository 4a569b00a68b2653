"""Adam of the SH coefficients deferred for Gaussians no camera of a step sees (``--lazy_sh_adam``).

A dense Adam steps every parameter every step. The SH coefficients (sh0, shN: 48 of a Gaussian's 59
floats at degree 3) of a Gaussian that no camera of the step sees get an exactly zero gradient, and
Adam still moves them (the momentum): m = b1 m, v = b2 v, p = p - a_u m / (sqrt(v) c_u + eps), with
a_u = lr / (1 - b1^u), c_u = 1 / sqrt(1 - b2^u) at Adam count u (kernels/adam.py). Those
coefficients are read only where the Gaussian is seen (its colour) and outside the step (checkpoint,
evaluation, export, densification), so their zero-gradient steps can wait:

- each Gaussian keeps the count through which its SH rows were stepped (``applied``, int32 [N]);
- the projection's forward (kernels/projection.py, ``lazy``) lists the Gaussians it sees
  (:class:`SeenRows`, compacted on the device) and catches their rows up to the current count
  (``count``, int32 [1] on the device, so a graph replay reads each step's), then writes their
  colours again;
- the step's Adam (kernels/adam.py, ``lazy_rows``) updates the SH rows of the listed Gaussians
  only, and :meth:`LazyShAdam.stepped` records their new count;
- :meth:`LazyShAdam.flush` catches every row up before anything else reads or moves them.

At city scale a camera sees a few percent of the Gaussians, and the dense Adam's 48 x 28 bytes of
SH traffic per Gaussian and step shrink to the seen ones'.

Catching up k zero-gradient steps after count t0 (counts u = t0 + 1 .. t0 + k), per coefficient::

    m_k = b1^k m,   v_k = b2^k v,
    p_k = p - lr (m / sqrt(v)) S1 + lr (eps m / v) S2,
    S1 = sum_{s=1..k} rho1^s w1(t0 + s),   rho1 = b1 / sqrt(b2),   w1(u) = sqrt(1 - b2^u) / (1 - b1^u),
    S2 = sum_{s=1..k} rho2^s w2(t0 + s),   rho2 = b1 / b2,         w2(u) = (1 - b2^u) / (1 - b1^u),

the sum of the dense updates a_u m_s / (sqrt(v_s) c_u + eps) expanded to first order in
e_s = eps / (sqrt(v_s) c_u); the remainder is below e_s^2 <= 2^-24 relative where eps <= 2^-12
sqrt(v_k) (c_u >= 1 and v_s >= v_k), which :func:`closed_form_applies` tests per coefficient. With
H_i(t) = sum_{s >= 1} rho_i^s w_i(t + s), tabulated once in float64 by a downward recursion
(:func:`make_tables`), S_i = H_i(t0) - rho_i^k H_i(t0 + k): a few table reads per Gaussian, however
long it was unseen. A coefficient with m = 0 keeps p and m (every term is 0) and only v decays. A
coefficient where the expansion does not hold (v = 0 with m != 0, or v decayed to ~eps^2) takes its
k steps one at a time with the dense kernel's float32 formula.

The decays use the float32 values of b1 and b2 that the dense kernel multiplies by, the bias
corrections the float64 ones that kernels/adam.py's host code uses. The dense float32 iteration
rounds every step; the closed form rounds once, so the two agree to float32 rounding (a few units
in the last place of p, m and v after k steps; closer to the exact result than the iteration), not
bit for bit. Reference: :func:`splat_train.kernels.reference.adam_zero_grad_steps` (the dense
iteration in float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np
import torch

from . import constants
from .adam import SeenRows, state_of

try:  # the CPU-only torch wheel may ship without Triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the environment
    triton = None

SH_KEYS = ("sh0", "shN")
"""The parameters whose Adam the module defers (their rows are read only for seen Gaussians)."""
BLOCK = 128  # Gaussians per program of the flush kernel
SEEN_BLOCK = 1024  # Gaussians per program of the seen rows' compaction and their stamp
EPS_RATIO = 2.0**-12  # the closed form holds where eps <= this times sqrt(v_k)
TAIL_STEPS = 2000  # terms beyond the tables' last count in the recursion's start (rho^2000 < 1e-90)
TABLE_ROWS = 8  # H1, H2, rho1^k, rho2^k, b1^k, b2^k, 1 - b1^u (float64 b1), 1 / sqrt(1 - b2^u)
STEP_ROWS = (8, 9)  # LazyShAdam's tables then hold sh0's and shN's Adam step sizes (step_sizes)


def available() -> bool:
    return triton is not None


def float32(x: float) -> float:
    """``x`` rounded to float32 (what a Triton kernel receives for a Python float argument)."""
    return float(np.float32(x))


def make_tables(beta1: float, beta2: float, max_count: int) -> np.ndarray:
    """float64 [TABLE_ROWS, max_count + 1]: for every count t (and every gap k) in 0..max_count,
    H1(t), H2(t), rho1^k, rho2^k, b1^k, b2^k (b1, b2 their float32 values), then 1 - b1^t and
    1 / sqrt(1 - b2^t) with the float64 betas (kernels/adam.py's step_constants; column 0 unused:
    1 and inf). The module docstring gives the formulas. Raises ValueError unless 0 < b1 < b2 < 1
    and max_count >= 1."""
    if not (0.0 < beta1 < beta2 < 1.0) or max_count < 1:
        raise ValueError(
            f"make_tables: needs 0 < beta1 < beta2 < 1 and max_count >= 1, got {beta1}, {beta2}, {max_count}"
        )
    b1f, b2f = float32(beta1), float32(beta2)
    rho1, rho2 = b1f / math.sqrt(b2f), b1f / b2f
    top = max_count + TAIL_STEPS
    u = np.arange(top + 1, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):  # u = 0: unused
        bc1 = 1.0 - beta1**u  # 0 at u = 0
        bc2 = 1.0 - beta2**u
        w1 = np.sqrt(bc2) / bc1
        w2 = bc2 / bc1
    h1, h2 = np.zeros(top + 1), np.zeros(top + 1)
    for t in range(top - 1, -1, -1):  # H(t) = rho (w(t + 1) + H(t + 1)); H(top) = 0 (rho^2000 < 1e-90)
        h1[t] = rho1 * (w1[t + 1] + h1[t + 1])
        h2[t] = rho2 * (w2[t + 1] + h2[t + 1])
    k = np.arange(max_count + 1, dtype=np.float64)
    cols = slice(0, max_count + 1)
    with np.errstate(divide="ignore"):
        inv_bc2_sqrt = 1.0 / np.sqrt(bc2[cols])
    return np.stack([h1[cols], h2[cols], rho1**k, rho2**k, b1f**k, b2f**k, bc1[cols], inv_bc2_sqrt]).astype(np.float64)


def step_sizes(lrs, beta1: float, max_count: int) -> np.ndarray:
    """float64 [len(lrs), max_count + 1]: row i, column u, lrs[i] / (1 - beta1^u) rounded to
    float32, computed as kernels/adam.py's step_constants computes the step size it gives the dense
    kernel at count u (Python floats: numpy's vectorised power can differ by an ulp); column 0
    unused (0). The catch-up's one-step-at-a-time fallback reads it."""
    out = np.zeros((len(lrs), max_count + 1), dtype=np.float64)
    for i, lr in enumerate(lrs):
        out[i, 1:] = np.array([float(lr) / (1.0 - beta1 ** float(u)) for u in range(1, max_count + 1)], np.float32)
    return out


def closed_form_applies(m: torch.Tensor, v: torch.Tensor, b2k: float, eps: float) -> torch.Tensor:
    """bool, elementwise: whether the closed form of the module docstring catches these moments up
    (m == 0, or v > 0 and eps <= 2^-12 sqrt(v b2^k)), in float64."""
    vk = v.double() * b2k
    return (m == 0) | ((v > 0) & (eps <= EPS_RATIO * vk.sqrt()))


if triton is not None:

    @triton.jit
    def lane_sums(tab_ptr, T1, t0, k, need):
        """Per lane, for k zero-gradient steps after count t0 (``need``): S1 and S2 of the module
        docstring and b1^k, b2^k, as float32 (the differences taken in float64)."""
        t0 = tl.where(need, t0, 0)
        k = tl.where(need, k, 0)
        h1 = tl.load(tab_ptr + t0, mask=need, other=0.0) - tl.load(
            tab_ptr + 2 * T1 + k, mask=need, other=0.0
        ) * tl.load(tab_ptr + t0 + k, mask=need, other=0.0)
        h2 = tl.load(tab_ptr + T1 + t0, mask=need, other=0.0) - tl.load(
            tab_ptr + 3 * T1 + k, mask=need, other=0.0
        ) * tl.load(tab_ptr + T1 + t0 + k, mask=need, other=0.0)
        b1k = tl.load(tab_ptr + 4 * T1 + k, mask=need, other=1.0)
        b2k = tl.load(tab_ptr + 5 * T1 + k, mask=need, other=1.0)
        return h1.to(tl.float32), h2.to(tl.float32), b1k.to(tl.float32), b2k.to(tl.float32)

    @triton.jit
    def catch_up(p_ptr, m_ptr, v_ptr, idx, need, t0, k, s1, s2, b1k, b2k, lr, step_row, tab_ptr, T1, beta1, beta2,
                 eps):  # fmt: skip
        """Elements ``idx`` (``need``) of a parameter and of its moments from ``p_ptr``, ``m_ptr``,
        ``v_ptr``: k zero-gradient Adam steps after count t0 (per element, or broadcast), in
        closed form where it applies, else one step at a time with kernels/adam.py's float32
        update (lr: the learning rate, float64; step_row: the tables' row of its step sizes,
        STEP_ROWS; each per element or broadcast)."""
        p = tl.load(p_ptr + idx, mask=need, other=0.0)
        m = tl.load(m_ptr + idx, mask=need, other=0.0)
        v = tl.load(v_ptr + idx, mask=need, other=0.0)
        vk = v * b2k
        closed = (m == 0.0) | ((v > 0.0) & (eps <= 0.000244140625 * tl.sqrt(vk)))  # 2^-12
        safe_v = tl.where(v > 0.0, v, 1.0)
        lrf = lr.to(tl.float32)
        dp = lrf * m * (s1 / tl.sqrt(safe_v) - eps * s2 / safe_v)
        p_new = tl.where(m == 0.0, p, p - dp)
        m_new = m * b1k
        v_new = vk
        slow = need & (closed == 0)
        steps = tl.max(tl.where(slow, k, 0), 0)
        for s in range(0, steps):  # rare: the dense update, step by step
            on = slow & (s < k)
            u = tl.where(on, t0 + 1 + s, 1)
            a = tl.load(tab_ptr + step_row * T1 + u, mask=on, other=0.0).to(tl.float32)
            c = tl.load(tab_ptr + 7 * T1 + u, mask=on, other=1.0).to(tl.float32)
            m1 = beta1 * m
            v1 = beta2 * v
            p1 = p - a * m1 / (tl.sqrt(v1) * c + eps)
            m = tl.where(on, m1, m)
            v = tl.where(on, v1, v)
            p = tl.where(on, p1, p)
        p_new = tl.where(slow, p, p_new)
        m_new = tl.where(slow, m, m_new)
        v_new = tl.where(slow, v, v_new)
        tl.store(p_ptr + idx, p_new, mask=need)
        tl.store(m_ptr + idx, m_new, mask=need)
        tl.store(v_ptr + idx, v_new, mask=need)

    @triton.jit
    def catch_up_rows(
        sh0_ptr, m_sh0_ptr, v_sh0_ptr, shn_ptr, m_shn_ptr, v_shn_ptr, applied_ptr, start, need, t, KR,
        tab_ptr, T1, lr_ptr, beta1, beta2, eps, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """Catch the sh0 and shN rows start .. start + BLOCK (``need``) up from their ``applied``
        count to ``t`` and record it; lr_ptr: float64 [2], the learning rates of sh0 and shN. One
        coefficient at a time per lane, addressed from the block's first row with int32 offsets
        ([BLOCK, 8] tiles of coefficients held 235 registers and ran 2.6x slower on an H100)."""
        rows = tl.arange(0, BLOCK)
        offs = start + rows
        t0 = tl.load(applied_ptr + offs, mask=need, other=0)
        k = t - t0
        need = need & (k > 0)
        s1, s2, b1k, b2k = lane_sums(tab_ptr, T1, t0, k, need)
        at = start * 3
        lr0 = tl.load(lr_ptr)
        for j in range(0, 3):
            catch_up(sh0_ptr + at, m_sh0_ptr + at, v_sh0_ptr + at, rows * 3 + j, need, t0, k, s1, s2, b1k, b2k, lr0,
                     8, tab_ptr, T1, beta1, beta2, eps)  # fmt: skip
        width = KR * 3
        at = start * width
        lr1 = tl.load(lr_ptr + 1)
        for j in range(0, width):
            catch_up(shn_ptr + at, m_shn_ptr + at, v_shn_ptr + at, rows * width + j, need, t0, k, s1, s2, b1k, b2k,
                     lr1, 9, tab_ptr, T1, beta1, beta2, eps)  # fmt: skip
        tl.store(applied_ptr + offs, t + tl.zeros_like(t0), mask=need)

    @triton.jit
    def catch_up_listed(
        sh0_ptr, m_sh0_ptr, v_sh0_ptr, shn_ptr, m_shn_ptr, v_shn_ptr, applied_ptr, rows_ptr, first, n, t, KR,
        tab_ptr, T1, lr_ptr, beta1, beta2, eps, ROWS: tl.constexpr, LANES: tl.constexpr,
    ):  # fmt: skip
        """Catch the sh0 and shN rows of the listed Gaussians ``rows_ptr[first : first + ROWS]``
        (those before ``n``) up from their ``applied`` count to ``t``, without recording it (the
        caller stamps ``applied`` after a barrier); lr_ptr: float64 [2], sh0's and shN's rates.
        LANES (a power of two >= 3 + 3 KR) lanes per row, lane j on coefficient j of the row
        (sh0's 3, then shN's 3 KR), so a row's loads and stores are contiguous."""
        lane = tl.arange(0, ROWS * LANES)
        j = lane % LANES
        i = first + lane // LANES
        width = KR * 3
        live = (i < n) & (j < 3 + width)
        r = tl.load(rows_ptr + i, mask=live, other=0).to(tl.int64)
        t0 = tl.load(applied_ptr + r, mask=live, other=0)
        k = t - t0
        need = live & (k > 0)
        s1, s2, b1k, b2k = lane_sums(tab_ptr, T1, t0, k, need)
        is0 = j < 3
        lr = tl.where(is0, tl.load(lr_ptr), tl.load(lr_ptr + 1))
        p = tl.where(is0, sh0_ptr + r * 3 + j, shn_ptr + r * width + (j - 3))
        m = tl.where(is0, m_sh0_ptr + r * 3 + j, m_shn_ptr + r * width + (j - 3))
        v = tl.where(is0, v_sh0_ptr + r * 3 + j, v_shn_ptr + r * width + (j - 3))
        catch_up(p, m, v, 0, need, t0, k, s1, s2, b1k, b2k, lr, tl.where(is0, 8, 9), tab_ptr, T1, beta1, beta2, eps)

    @triton.jit(do_not_specialize=["N"])
    def _seen_rows_kernel(
        bits_ptr, rows_ptr, count_ptr, applied_ptr, t_ptr, wrows_ptr, wcount_ptr, N, BLOCK: tl.constexpr,
        WAITING: tl.constexpr,
    ):  # fmt: skip
        """Appends the indices of the Gaussians with a visibility bit set (``bits``, int32 [N], the
        projection forward's) to ``rows`` at ``count`` (int32 [1], zeroed before): one atomic add
        per block, so the blocks' runs land in any order. WAITING: those of them whose ``applied``
        count is behind the count at ``t_ptr`` also to ``wrows`` at ``wcount``."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = offs < N
        seen = (tl.load(bits_ptr + offs, mask=live, other=0) != 0).to(tl.int32)
        at = tl.atomic_add(count_ptr, tl.sum(seen, 0))
        tl.store(rows_ptr + at + tl.cumsum(seen, 0) - seen, offs.to(tl.int32), mask=seen != 0)
        if WAITING:
            t = tl.load(t_ptr)
            wait = ((seen != 0) & (tl.load(applied_ptr + offs, mask=seen != 0, other=0) < t)).to(tl.int32)
            at = tl.atomic_add(wcount_ptr, tl.sum(wait, 0))
            tl.store(wrows_ptr + at + tl.cumsum(wait, 0) - wait, offs.to(tl.int32), mask=wait != 0)

    @triton.jit(do_not_specialize=["t"])
    def _stamp_kernel(rows_ptr, seen_ptr, applied_ptr, t, BLOCK: tl.constexpr):
        """``applied`` = t for the seen rows (``rows`` [:seen]); a fixed grid striding over them."""
        n = tl.load(seen_ptr)
        for b in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
            k = b * BLOCK + tl.arange(0, BLOCK)
            live = k < n
            r = tl.load(rows_ptr + k, mask=live, other=0)
            tl.store(applied_ptr + r, t + tl.zeros_like(r), mask=live)

    @triton.jit(do_not_specialize=["N", "KR", "t"])
    def _flush_kernel(
        sh0_ptr, m_sh0_ptr, v_sh0_ptr, shn_ptr, m_shn_ptr, v_shn_ptr, applied_ptr, tab_ptr, lr_ptr, rows_ptr,
        N, KR, t, T1, beta1, beta2, eps, BLOCK: tl.constexpr, ROWS: tl.constexpr,
    ):  # fmt: skip
        """Rows behind count ``t`` caught up (ROWS: only those whose byte in rows_ptr is set)."""
        start = tl.program_id(0).to(tl.int64) * BLOCK
        offs = start + tl.arange(0, BLOCK)
        live = offs < N
        if ROWS:
            live = live & (tl.load(rows_ptr + offs, mask=live, other=0) != 0)
        stale = live & (tl.load(applied_ptr + offs, mask=live, other=t) < t)
        if tl.max(stale.to(tl.int32), 0) > 0:
            catch_up_rows(sh0_ptr, m_sh0_ptr, v_sh0_ptr, shn_ptr, m_shn_ptr, v_shn_ptr, applied_ptr, start, stale, t,
                          KR, tab_ptr, T1, lr_ptr, beta1, beta2, eps, BLOCK)  # fmt: skip


def kernel_specs() -> dict:
    """The flush kernel at the configuration :meth:`LazyShAdam.flush` launches (kernels/registry.py's format)."""
    ptrs = {"applied_ptr": "*i32", "tab_ptr": "*fp64", "lr_ptr": "*fp64"}
    floats = {"beta1": "fp32", "beta2": "fp32", "eps": "fp32"}
    ptrs["rows_ptr"] = "*u8"
    ints = {"bits_ptr": "*i32", "rows_ptr": "*i32", "count_ptr": "*i32", "seen_ptr": "*i32", "applied_ptr": "*i32"}
    ints.update(t_ptr="*i32", wrows_ptr="*i32", wcount_ptr="*i32")
    return {
        "lazy_sh_flush": (_flush_kernel, dict(BLOCK=BLOCK, ROWS=False), ptrs, floats, 4),
        "lazy_seen_rows": (_seen_rows_kernel, dict(BLOCK=SEEN_BLOCK, WAITING=True), ints, {}, 4),
        "lazy_stamp": (_stamp_kernel, dict(BLOCK=SEEN_BLOCK), ints, {}, 4),
    }


def list_seen(
    bits: torch.Tensor, seen: SeenRows, applied: Optional[torch.Tensor] = None, count: Optional[torch.Tensor] = None
) -> None:
    """List in ``seen`` the Gaussians with a visibility bit set (``bits``: int32 [N], the
    projection forward's; ``seen`` with room for N rows), on the device: no synchronization. With
    ``applied`` (int32 [N]) and ``count`` (int32 [1], LazyShAdam's), also those of them whose
    deferred SH steps wait (applied < count) in ``seen.waiting_rows``; without, none. Raises
    ValueError where ``seen`` has too little room."""
    n = bits.shape[0]
    if seen.rows.numel() < n or seen.waiting_rows.numel() < n:
        raise ValueError(f"list_seen: room for {seen.rows.numel()} rows, {n} Gaussians")
    seen.count.zero_()
    seen.waiting.zero_()
    if n:
        waiting = applied is not None and count is not None
        _seen_rows_kernel[(triton.cdiv(n, SEEN_BLOCK),)](
            bits, seen.rows, seen.count, applied if waiting else bits, count if waiting else seen.count,
            seen.waiting_rows, seen.waiting, n, BLOCK=SEEN_BLOCK, WAITING=waiting,
        )  # fmt: skip


@dataclass(frozen=True)
class LazyRows:
    """What the projection's forward needs to catch the rows it sees up (kernels/projection.py,
    ``lazy``): ``applied`` int32 [N], ``count`` int32 [1], ``tables`` float64 [TABLE_ROWS + 2,
    T + 1] (the step sizes last), ``lr`` float64 [2] (sh0's, shN's), ``moments`` (exp_avg, exp_avg_sq of sh0, then of shN),
    beta1, beta2, eps as float32 values, and ``seen`` (capacity N), where the forward lists the
    Gaussians it saw for the step's Adam; ``unseen_zeros``: the backward writes the other
    Gaussians' zero geometric gradients (a loss term outside the projection adds to them), else
    leaves them unwritten for the Adam to read as zeros (kernels/projection.backward_into)."""

    applied: torch.Tensor
    count: torch.Tensor
    tables: torch.Tensor
    lr: torch.Tensor
    moments: tuple
    beta1: float
    beta2: float
    eps: float
    seen: SeenRows
    unseen_zeros: bool = True

    def key(self) -> tuple:
        """The storage a captured forward reads and writes."""
        tensors = (self.applied, self.count, self.tables, self.lr, *self.moments, self.seen.rows, self.seen.count)
        tensors += (self.seen.waiting_rows, self.seen.waiting)
        return tuple(t.data_ptr() for t in tensors)


class LazyShAdam:
    """The deferred SH Adam of one shard (module docstring): ``optimizers`` maps "sh0" and "shN"
    (and the other parameters) to their torch.optim.Adam of one tensor (model.create_optimizers),
    ``num`` the shard's Gaussians, ``max_count`` the largest Adam count the run reaches (its
    --max_steps). Holds ``applied`` (int32 [num]), ``count`` (int32 [1], the SH Adams' count) and
    the tables on ``device``; ``unseen_zeros``: :class:`LazyRows`'.

    Raises ValueError where the two SH Adams differ in betas or eps (one table serves both)."""

    def __init__(
        self,
        optimizers: Mapping[str, torch.optim.Optimizer],
        num: int,
        max_count: int,
        device,
        unseen_zeros: bool = True,
    ):
        groups = [self._group(optimizers, k) for k in SH_KEYS]
        hyper = {(tuple(map(float, g["betas"])), float(g["eps"])) for g in groups}
        if len(hyper) != 1:
            raise ValueError(f"--lazy_sh_adam: the SH Adams differ in betas / eps: {sorted(hyper)}")
        ((betas, eps),) = hyper
        self.beta1, self.beta2, self.eps = betas[0], betas[1], eps
        self.device = torch.device(device)
        self.max_count = int(max_count)
        self.unseen_zeros = unseen_zeros
        self.lrs = [float(g["lr"]) for g in groups]
        self.tables = self._tables()
        self.lr = torch.tensor(self.lrs, dtype=torch.float64, device=self.device)
        self.count = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.applied = torch.zeros(0, dtype=torch.int32, device=self.device)
        self.seen = SeenRows.empty(0, self.device)
        self.reset(optimizers, num)

    @staticmethod
    def _group(optimizers, key: str) -> dict:
        ((group,),) = (optimizers[key].param_groups,)
        return group

    @staticmethod
    def host_count(optimizers) -> int:
        """The SH Adams' step count (torch's state; 0 before the first step). AssertionError where
        sh0's and shN's differ (they step together)."""
        counts = []
        for k in SH_KEYS:
            ((p,),) = (LazyShAdam._group(optimizers, k)["params"],)
            state = optimizers[k].state.get(p, {})
            counts.append(int(float(state["step"])) if "step" in state else 0)
        assert counts[0] == counts[1], f"sh0 and shN stepped {counts[0]} and {counts[1]} times"
        return counts[0]

    def _check_count(self, t: int) -> None:
        """Tables that reach count ``t`` (a checkpoint from a longer run, a run past --max_steps):
        made again, twice as long, where they do not (the next capture takes the new storage)."""
        if t > self.max_count:
            self.max_count = max(t, 2 * self.max_count)
            self.tables = self._tables()

    def _tables(self) -> torch.Tensor:
        """make_tables' rows, then the SH learning rates' step sizes (STEP_ROWS), on the device."""
        tab = np.concatenate(
            [make_tables(self.beta1, self.beta2, self.max_count), step_sizes(self.lrs, self.beta1, self.max_count)]
        )
        return torch.from_numpy(tab).to(self.device)

    def reset(self, optimizers, num: int) -> None:
        """Every row stepped through the current count (after a :meth:`flush`, a surgery that
        changed the rows, or a loaded checkpoint): ``applied`` = count, ``num`` rows."""
        t = self.host_count(optimizers)
        self._check_count(t)
        if self.applied.numel() != num:
            self.applied = torch.empty(num, dtype=torch.int32, device=self.device)
            self.seen = SeenRows.empty(num, self.device)
        self.applied.fill_(t)
        self.count.fill_(t)

    def moments(self, optimizers, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(exp_avg, exp_avg_sq) of parameter ``key``, made as torch makes them where missing."""
        ((p,),) = (self._group(optimizers, key)["params"],)
        state = state_of(optimizers[key], p)
        return state["exp_avg"], state["exp_avg_sq"]

    def scalars(self) -> tuple[float, float, float]:
        """(beta1, beta2, eps) as float32 values: what the dense kernel multiplies by."""
        return float32(self.beta1), float32(self.beta2), float32(self.eps)

    def rows(self, optimizers) -> LazyRows:
        """The projection forward's view of this state (its tensors, not copies)."""
        moments = tuple(m for k in SH_KEYS for m in self.moments(optimizers, k))
        return LazyRows(
            self.applied, self.count, self.tables, self.lr, moments, *self.scalars(), self.seen, self.unseen_zeros
        )

    def check_lrs(self, params, optimizers) -> None:
        """Where an SH learning rate changed since the last step, catch every row up at the old
        one first (the closed form takes one rate over the rows' whole gap)."""
        lrs = [float(self._group(optimizers, k)["lr"]) for k in SH_KEYS]
        if lrs != self.lrs:
            self.flush(params, optimizers)
            self.lrs = lrs
            self.lr.copy_(torch.tensor(lrs, dtype=torch.float64))
            self.tables[STEP_ROWS[0] :].copy_(torch.from_numpy(step_sizes(lrs, self.beta1, self.max_count)))

    @torch.no_grad()
    def flush(self, params: Mapping[str, torch.Tensor], optimizers, rows: Optional[torch.Tensor] = None) -> None:
        """Catch every SH row (``rows``, bool [N]: those only) up to the current count: after
        this, the SH parameters and their moments are what a dense Adam would hold. ``params``
        the shard's (sh0 [N, 1, 3], shN [N, K - 1, 3])."""
        t = self.host_count(optimizers)
        self._check_count(t)
        sh0, shn = params["sh0"], params["shN"]
        n = sh0.shape[0]
        assert self.applied.numel() == n, f"{self.applied.numel()} rows recorded for {n} Gaussians"
        if n == 0:
            return
        (m0, v0), (m1, v1) = self.moments(optimizers, "sh0"), self.moments(optimizers, "shN")
        beta1, beta2, eps = self.scalars()
        if rows is not None and rows.shape != (n,):
            raise ValueError(f"LazyShAdam.flush: rows must be bool ({n},), got {tuple(rows.shape)}")
        mask = rows.to(torch.uint8).contiguous() if rows is not None else self.applied  # unused without ROWS
        _flush_kernel[(triton.cdiv(n, BLOCK),)](
            sh0.data, m0, v0, shn.data, m1, v1, self.applied, self.tables, self.lr, mask,
            n, shn.shape[1], t, self.tables.shape[1], beta1, beta2, eps, BLOCK=BLOCK, ROWS=rows is not None,
            num_warps=4,
        )  # fmt: skip
        self.count.fill_(t)

    def stepped(self, optimizers, seen: Optional[SeenRows]) -> None:
        """After the step's Adam: the rows it updated (``seen``, the projection's list; None: every
        row, a step whose SH Adam ran densely) are at the new count, which ``count`` takes."""
        t = self.host_count(optimizers)
        self._check_count(t)
        if seen is None:
            self.applied.fill_(t)
        elif self.applied.numel():
            grid = (min(triton.cdiv(self.applied.numel(), SEEN_BLOCK), constants.LISTED_PROGRAMS),)
            _stamp_kernel[grid](seen.rows, seen.count, self.applied, t, BLOCK=SEEN_BLOCK, num_warps=4)
        self.count.fill_(t)
