"""Adam for several parameter tensors in one Triton launch.

A 3DGS step updates six parameter tensors (means, scales, quats, opacities, sh0, shN), each with
its own learning rate. torch.optim.Adam runs one optimizer per tensor (gsplat's densification
swaps parameters and their moments one tensor at a time) and, even fused, costs a kernel and
tens of microseconds of host work per tensor. :func:`adam_step` takes those optimizers as they
are (their param_groups, learning rates after the scheduler, and state: ``step``, ``exp_avg``,
``exp_avg_sq``, kept in torch's format, so checkpoints and gsplat's surgery are unchanged) and
updates up to :data:`MAX_TENSORS` tensors per launch: each program handles one BLOCK-sized slice
of one tensor, found from the programs' cumulative offsets.

Update (Kingma & Ba 2015, Algorithm 1, with torch.optim.Adam's placement of eps), per element,
for step t (counted per tensor, on the host: no synchronization):
    m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2,
    p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
The PyTorch reference is :func:`splat_train.kernels.reference.adam_update`.

Selective variant (``visible``: bool [N] over the Gaussians, ``--visible_adam``): gsplat's
SelectiveAdam (gsplat/optimizers/selective_adam.py, csrc/AdamCUDA.cu; Taming 3DGS, Mallick et al.
2024): only the rows i of visible Gaussians update m, v and p, with the plain step
p = p - lr m / (sqrt(v) + eps), no bias correction and no step count, as gsplat's kernel.
Reference: :func:`splat_train.kernels.reference.selective_adam_update`.

Deferred variant (``lazy_rows``: a :class:`SeenRows`, ``--lazy_sh_adam``): the tensors
named in kernels/lazy_adam.SH_KEYS update only the rows it lists (the Gaussians some camera saw,
whose earlier zero-gradient steps the projection caught up), with the plain Adam update above; the
others' zero-gradient steps wait. The list's length stays on the device: a fixed number of programs
per deferred tensor strides over the listed rows. The other tensors step densely in the same launch;
where the projection's backward left the unseen Gaussians' gradient rows unwritten (``SeenRows.bits``
set), they read those rows as the zeros they are, by the visibility bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from . import constants

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only torch wheels
    triton = None

MAX_TENSORS = 6  # parameter tensors per launch (the kernel's argument slots)
BLOCK = 1024  # elements per program


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def adam_in_place(p_ptr, m_ptr, v_ptr, idx, mask, g, step_size, inv_bc2_sqrt, beta1, beta2, eps):
        """The update of the module docstring on the elements ``idx`` (``mask``) of a parameter
        and its moments, gradient ``g`` (same shape as ``idx``), step_size = lr / (1 - beta1^t),
        inv_bc2_sqrt = 1 / sqrt(1 - beta2^t): the one place it is written (kernels/projection.py's
        backward takes it too)."""
        m = tl.load(m_ptr + idx, mask=mask, other=0.0)
        v = tl.load(v_ptr + idx, mask=mask, other=0.0)
        p = tl.load(p_ptr + idx, mask=mask, other=0.0)
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        p = p - step_size * m / (tl.sqrt(v) * inv_bc2_sqrt + eps)
        tl.store(m_ptr + idx, m, mask=mask)
        tl.store(v_ptr + idx, v, mask=mask)
        tl.store(p_ptr + idx, p, mask=mask)

    @triton.jit
    def _row_of(block, offs, row, BLOCK: tl.constexpr):
        """offs // row for the block's elements (int64 offsets): one 64-bit division for the
        block's first row, then 32-bit ones within the block (a 64-bit division per element cost
        more than the update's memory traffic)."""
        first = (block.to(tl.int64) * BLOCK) // row
        return first + ((offs - first * row).to(tl.int32) // row)

    @triton.jit
    def _update(
        p_ptr,
        g_ptr,
        m_ptr,
        v_ptr,
        n,
        block,
        step_size,
        inv_bc2_sqrt,
        beta1,
        beta2,
        eps,
        vis_ptr,
        row,
        cnt_ptr,
        nprog,
        seen_ptr,
        BLOCK: tl.constexpr,
        SELECTIVE: tl.constexpr,
        MASKED: tl.constexpr,
        SEEN: tl.constexpr,
    ):
        if MASKED:
            if row > 0:  # a deferred tensor: the listed rows only (lazy_rows)
                _update_listed(p_ptr, g_ptr, m_ptr, v_ptr, n, block, step_size, inv_bc2_sqrt, beta1, beta2, eps,
                               vis_ptr, row, cnt_ptr, nprog, BLOCK)  # fmt: skip
            else:  # SEEN: the gradient rows of unseen Gaussians (-row elements each) read as zeros
                _update_block(p_ptr, g_ptr, m_ptr, v_ptr, n, block, step_size, inv_bc2_sqrt, beta1, beta2, eps,
                              seen_ptr, -row, BLOCK, False, SEEN)  # fmt: skip
        else:
            _update_block(p_ptr, g_ptr, m_ptr, v_ptr, n, block, step_size, inv_bc2_sqrt, beta1, beta2, eps, vis_ptr,
                          row, BLOCK, SELECTIVE, False)  # fmt: skip

    @triton.jit
    def _update_block(
        p_ptr, g_ptr, m_ptr, v_ptr, n, block, step_size, inv_bc2_sqrt, beta1, beta2, eps, vis_ptr, row,
        BLOCK: tl.constexpr, SELECTIVE: tl.constexpr, SEEN: tl.constexpr,
    ):  # fmt: skip
        """Block ``block`` of a tensor of ``n`` elements (SELECTIVE: of the rows marked in vis_ptr;
        SEEN: every row, the gradient read only for the rows with a bit in vis_ptr, the others'
        taken as zero); row = elements per Gaussian."""
        # 64-bit offsets: shN alone passes 2^31 elements at about 48 M Gaussians on one rank
        offs = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if SELECTIVE:  # only the rows (Gaussians) marked visible
            mask = mask & (tl.load(vis_ptr + _row_of(block, offs, row, BLOCK), mask=mask, other=0) != 0)
        if SEEN:
            read = mask & (tl.load(vis_ptr + _row_of(block, offs, row, BLOCK), mask=mask, other=0) != 0)
        else:
            read = mask
        g = tl.load(g_ptr + offs, mask=read, other=0.0)
        adam_in_place(p_ptr, m_ptr, v_ptr, offs, mask, g, step_size, inv_bc2_sqrt, beta1, beta2, eps)

    @triton.jit
    def _update_listed(
        p_ptr, g_ptr, m_ptr, v_ptr, n, first, step_size, inv_bc2_sqrt, beta1, beta2, eps, rows_ptr, row, cnt_ptr,
        nprog, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """The rows listed in rows_ptr[:cnt] (``row`` elements each), as one run of cnt x row
        elements that the tensor's ``nprog`` programs stride over from block ``first``: the count
        is known on the device only, and the programs touch the listed rows alone. A list of every
        row (cnt x row = n, the tensor's elements: each row once) is the tensor itself, stepped in
        its own order without reading the list (where every Gaussian is seen)."""
        total = tl.load(cnt_ptr).to(tl.int64) * row
        every = total == n
        for b in range(first, tl.cdiv(total, BLOCK).to(tl.int32), nprog):
            blk = tl.full([], 0, tl.int64) + b  # the loop's index a tensor under the interpreter too
            e = blk * BLOCK + tl.arange(0, BLOCK)
            mask = e < total
            if every:
                offs = e
            else:
                k = _row_of(blk, e, row, BLOCK)  # the k-th listed row
                r = tl.load(rows_ptr + k, mask=mask, other=0).to(tl.int64)
                offs = r * row + (e - k * row)
            g = tl.load(g_ptr + offs, mask=mask, other=0.0)
            adam_in_place(p_ptr, m_ptr, v_ptr, offs, mask, g, step_size, inv_bc2_sqrt, beta1, beta2, eps)

    _SIZES = ["n0", "n1", "n2", "n3", "n4", "n5", "e1", "e2", "e3", "e4", "e5"]

    # sizes change at every densification: no recompilation for their divisibility
    @triton.jit(do_not_specialize=_SIZES)
    def _adam_kernel(
        p0,
        g0,
        m0,
        v0,
        p1,
        g1,
        m1,
        v1,
        p2,
        g2,
        m2,
        v2,
        p3,
        g3,
        m3,
        v3,
        p4,
        g4,
        m4,
        v4,
        p5,
        g5,
        m5,
        v5,
        n0,
        n1,
        n2,
        n3,
        n4,
        n5,
        e1,
        e2,
        e3,
        e4,
        e5,
        s0,
        s1,
        s2,
        s3,
        s4,
        s5,
        c0,
        c1,
        c2,
        c3,
        c4,
        c5,
        beta1,
        beta2,
        eps,
        vis,
        r0,
        r1,
        r2,
        r3,
        r4,
        r5,
        cnt,
        seen,
        BLOCK: tl.constexpr,
        SELECTIVE: tl.constexpr,
        MASKED: tl.constexpr = False,
        SEEN: tl.constexpr = False,
    ):
        """Program pid updates block pid - e_i of tensor i, where e_i (e_0 = 0) is the first
        program of tensor i; s_i = lr_i / (1 - beta1^t_i), c_i = 1 / sqrt(1 - beta2^t_i)
        (selective: s_i = lr_i, c_i = 1); r_i: elements per Gaussian of tensor i (selective; with
        MASKED, 0 for a tensor that steps densely, whose programs then take one block each, or
        with SEEN minus its elements per Gaussian, the gradient rows of Gaussians with no bit in
        ``seen`` (int32 [N]) read as zeros; a deferred tensor's programs stride over the rows
        listed in vis[:cnt])."""
        pid = tl.program_id(0)
        if pid < e1:
            _update(p0, g0, m0, v0, n0, pid, s0, c0, beta1, beta2, eps, vis, r0, cnt, e1, seen, BLOCK, SELECTIVE,
                    MASKED, SEEN)  # fmt: skip
        elif pid < e2:
            _update(p1, g1, m1, v1, n1, pid - e1, s1, c1, beta1, beta2, eps, vis, r1, cnt, e2 - e1, seen, BLOCK,
                    SELECTIVE, MASKED, SEEN)  # fmt: skip
        elif pid < e3:
            _update(p2, g2, m2, v2, n2, pid - e2, s2, c2, beta1, beta2, eps, vis, r2, cnt, e3 - e2, seen, BLOCK,
                    SELECTIVE, MASKED, SEEN)  # fmt: skip
        elif pid < e4:
            _update(p3, g3, m3, v3, n3, pid - e3, s3, c3, beta1, beta2, eps, vis, r3, cnt, e4 - e3, seen, BLOCK,
                    SELECTIVE, MASKED, SEEN)  # fmt: skip
        elif pid < e5:
            _update(p4, g4, m4, v4, n4, pid - e4, s4, c4, beta1, beta2, eps, vis, r4, cnt, e5 - e4, seen, BLOCK,
                    SELECTIVE, MASKED, SEEN)  # fmt: skip
        else:
            _update(p5, g5, m5, v5, n5, pid - e5, s5, c5, beta1, beta2, eps, vis, r5, cnt, tl.num_programs(0) - e5,
                    seen, BLOCK, SELECTIVE, MASKED, SEEN)  # fmt: skip


@dataclass
class SeenRows:
    """Rows as a list on the device (the deferred variant's: the Gaussians a step's projection
    saw, listed by kernels/lazy_adam.list_seen): ``rows`` (int32 [capacity]) holds their indices
    in its first ``count`` (int32 [1]) entries, in any order. Kernels read the count on the
    device, so a step needs no host synchronization to learn it. ``waiting_rows`` (int32
    [capacity]) lists, in its first ``waiting`` (int32 [1]) entries, those of them whose deferred SH
    steps wait (the projection's forward catches them up; the bench's bytes model counts them).
    ``bits``: where the projection's backward over the list left the other Gaussians' gradient
    rows unwritten (kernels/projection.backward_into), the visibility bits (int32 [N]) the list was
    made from, by which the Adam reads those rows as zeros; None: every geometric gradient row was
    written (the unseen SH rows, deferred, are never read)."""

    rows: torch.Tensor
    count: torch.Tensor
    waiting_rows: torch.Tensor
    waiting: torch.Tensor
    bits: Optional[torch.Tensor] = None

    @staticmethod
    def empty(capacity: int, device) -> "SeenRows":
        """Room for ``capacity`` rows, none listed."""
        return SeenRows(
            torch.zeros(max(capacity, 1), dtype=torch.int32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device),
            torch.zeros(max(capacity, 1), dtype=torch.int32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device),
        )

    @staticmethod
    def from_mask(mask: torch.Tensor) -> "SeenRows":
        """The rows of ``mask`` (bool [N]), ascending (synchronizes: tests and references)."""
        seen = SeenRows.empty(mask.shape[0], mask.device)
        idx = mask.nonzero().flatten()
        seen.rows[: idx.numel()] = idx.to(torch.int32)
        seen.count.fill_(idx.numel())
        return seen

    def mask(self, n: int) -> torch.Tensor:
        """bool [n]: the listed rows (synchronizes)."""
        out = torch.zeros(n, dtype=torch.bool, device=self.rows.device)
        return out.index_fill_(0, self.rows[: int(self.count)].long(), True)


def supported(optimizer: torch.optim.Optimizer) -> bool:
    """Whether :func:`adam_step` can run ``optimizer``: a torch.optim.Adam without amsgrad,
    weight decay, maximize or differentiable, over contiguous float32 tensors."""
    if type(optimizer) is not torch.optim.Adam:
        return False
    for group in optimizer.param_groups:
        if group["amsgrad"] or group["weight_decay"] or group["maximize"] or group.get("differentiable"):
            return False
        if any(p.dtype != torch.float32 or not p.is_contiguous() for p in group["params"]):
            return False
    return True


def state_of(optimizer: torch.optim.Adam, p: torch.Tensor) -> dict:
    """``optimizer``'s state of ``p``, made as torch.optim.Adam makes it on first use (step 0,
    zero moments) when it has none; the step count moved to the host where a fused Adam kept it
    on the device."""
    state = optimizer.state[p]
    if len(state) == 0:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    if state["step"].device.type != "cpu":  # saved by a fused Adam: count on the host
        state["step"] = state["step"].cpu()
    return state


def params_with_state(optimizers: Iterable[torch.optim.Adam]):
    """Yields (param, state, param group) for every parameter with a gradient, its state as
    :func:`state_of` gives it."""
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    yield p, state_of(opt, p), group


def step_constants(group: dict, state: dict, selective: bool = False) -> tuple[float, float]:
    """(step size, 1 / sqrt(bias correction 2)) of the next step of a parameter of ``group``
    whose state is ``state`` (its count not advanced): lr / (1 - beta1^t) and 1 / sqrt(1 -
    beta2^t) for t = step + 1; ``selective``: gsplat's SelectiveAdam terms (lr, 1)."""
    lr = float(group["lr"])
    if selective:
        return lr, 1.0
    beta1, beta2 = group["betas"]
    t = float(state["step"]) + 1
    return lr / (1.0 - beta1**t), 1.0 / math.sqrt(1.0 - beta2**t)


def _entries(optimizers: Iterable[torch.optim.Adam], selective: bool = False) -> list[tuple]:
    """(param, grad, exp_avg, exp_avg_sq, step_size, 1/sqrt(bias correction 2), hyper, name) of
    every parameter with a gradient; advances each one's host-side step count (torch's format).
    ``selective``: gsplat's SelectiveAdam terms (step size lr, no bias correction, no count);
    name: the param group's "name" (model.create_optimizers), or None."""
    out = []
    for p, state, group in params_with_state(optimizers):
        beta1, beta2 = group["betas"]
        hyper = (float(beta1), float(beta2), float(group["eps"]))
        step_size, inv_bc2_sqrt = step_constants(group, state, selective)
        if not selective:
            state["step"] += 1
        entry = (p, p.grad.contiguous(), state["exp_avg"], state["exp_avg_sq"], step_size, inv_bc2_sqrt, hyper)
        out.append(entry + (group.get("name"),))
    return out


@torch.no_grad()
def adam_step(
    optimizers: Iterable[torch.optim.Adam],
    visible: torch.Tensor | None = None,
    lazy_rows: SeenRows | None = None,
    lazy_names: tuple = ("sh0", "shN"),
) -> None:
    """One Adam step of every parameter (with a gradient) of ``optimizers``, in
    ceil(tensors / MAX_TENSORS) launches per (betas, eps) combination. The optimizers must pass
    :func:`supported` and their tensors live on one CUDA/ROCm device (or the CPU under
    TRITON_INTERPRET=1). Gradients are left in place (zero or drop them after).
    ``visible`` (bool [N], N the first dimension of every parameter): the selective update of
    the module docstring. ``lazy_rows`` (:class:`SeenRows`, room for N rows): the deferred
    update of the module docstring for the parameters whose group is named in ``lazy_names``
    (kernels/lazy_adam.SH_KEYS).
    Raises ValueError when both are given."""
    if visible is not None and lazy_rows is not None:
        raise ValueError("adam_step: visible (SelectiveAdam) and lazy_rows (deferred Adam) exclude each other")
    entries = _entries(optimizers, selective=visible is not None)
    if lazy_rows is not None:
        named = {e[7] for e in entries}
        if not set(lazy_names) <= named:  # a deferred tensor stepped densely would take its steps twice
            raise ValueError(f"adam_step: lazy_rows names {lazy_names}, the parameter groups {sorted(map(str, named))}")
    by_hyper: dict[tuple, list] = {}
    for e in entries:
        by_hyper.setdefault(e[6], []).append(e)
    for (beta1, beta2, eps), group in by_hyper.items():
        for i in range(0, len(group), MAX_TENSORS):
            _launch(group[i : i + MAX_TENSORS], beta1, beta2, eps, visible, lazy_rows, lazy_names)


def _launch(
    entries: list[tuple],
    beta1: float,
    beta2: float,
    eps: float,
    visible: torch.Tensor | None = None,
    lazy_rows: SeenRows | None = None,
    lazy_names: tuple = (),
) -> None:
    # a launch with a deferred tensor, or any launch where the unseen rows' gradients are unwritten
    masked = lazy_rows is not None and (any(e[7] in lazy_names for e in entries) or lazy_rows.bits is not None)
    listed = [masked and e[7] in lazy_names for e in entries]
    # a deferred tensor: programs that stride over its listed rows (at most constants.LISTED_PROGRAMS)
    blocks = [
        min(triton.cdiv(e[0].numel(), BLOCK), constants.LISTED_PROGRAMS) if on else triton.cdiv(e[0].numel(), BLOCK)
        for e, on in zip(entries, listed)
    ]
    starts = [sum(blocks[:i]) for i in range(1, MAX_TENSORS)]  # e1..e5
    total = sum(blocks)
    if total == 0:
        return
    pad = entries[-1]  # unused slots point at a real tensor; no program reaches them
    slots = entries + [pad] * (MAX_TENSORS - len(entries))
    tensors = [t for e in slots for t in e[:4]]
    sizes = [e[0].numel() for e in slots]
    cnt = seen = entries[0][0]  # unused pointers, but with lazy_rows (and its bits)
    if visible is not None:
        assert all(e[0].shape[0] == visible.shape[0] for e in entries), "visible must have one entry per Gaussian"
        rows = [max(e[0][:1].numel(), 1) for e in slots]
        vis = visible.to(torch.uint8).contiguous()
    elif masked:
        assert lazy_rows is not None
        lazy = [e[7] in lazy_names for e in slots]
        room = lazy_rows.rows.numel()
        assert all(e[0].shape[0] <= room for e, on in zip(slots, lazy) if on), "room for every row"
        bits = lazy_rows.bits  # the unseen Gaussians' gradient rows unwritten: read as zeros by these bits
        if bits is not None:
            assert all(e[0].shape[0] == bits.shape[0] for e in slots), "a bit for every row"
            seen = bits
        # listed: elements per Gaussian; dense: 0, or minus them where the bits say which rows to read
        rows = [max(e[0][:1].numel(), 1) * (1 if on else -1 if bits is not None else 0) for e, on in zip(slots, lazy)]
        vis, cnt = lazy_rows.rows, lazy_rows.count
    else:
        rows, vis = [1] * MAX_TENSORS, entries[0][0]  # unused pointer
    _adam_kernel[(total,)](
        *tensors,
        *sizes,
        *[min(s, total) for s in starts],
        *[e[4] for e in slots],
        *[e[5] for e in slots],
        beta1,
        beta2,
        eps,
        vis,
        *rows,
        cnt,
        seen,
        BLOCK=BLOCK,
        SELECTIVE=visible is not None,
        MASKED=masked,
        SEEN=masked and lazy_rows is not None and lazy_rows.bits is not None,
    )
