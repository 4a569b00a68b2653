"""This rank's Gaussians and everything that has a row per Gaussian: :class:`GaussianShard`.

The stages that read or change the Gaussians (densification in the training step, pruning,
evaluation, export, checkpoints) take a shard, not the Trainer. Changing the number of Gaussians
goes through :meth:`GaussianShard.remove` (parameters, their Adam moments and the strategy's
per-Gaussian state together) or the densification strategy, which does the same surgery with
gsplat's ops; either way the shard forgets the gathered shard sizes (:attr:`world_sizes`), so the
next training step gathers them again.

Light to import (torch only): checkpoint.py takes :data:`PER_GAUSSIAN_STATE` from here.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

PER_GAUSSIAN_STATE = ("grad2d", "count", "radii")
"""Strategy-state entries with one row per Gaussian (DefaultStrategy); others (MCMC's binomial
table) are not per-Gaussian and must not be sliced."""


class GaussianShard:
    """One rank's Gaussians: ``params`` (means, scales, quats, opacities, sh0, shN; a
    ParameterDict), one Adam per parameter (``optimizers``), the means' learning-rate ``scheduler``,
    the densification ``strategy`` and its ``strategy_state``. ``world_sizes``: the Gaussian count
    of every rank as last gathered (None: gather before the next step)."""

    def __init__(self, params, optimizers: dict, scheduler, strategy, strategy_state: dict):
        self.params = params
        self.optimizers = optimizers
        self.scheduler = scheduler
        self.strategy = strategy
        self.strategy_state = strategy_state
        self.world_sizes: Optional[list[int]] = None
        self.lazy: Any = None  # kernels/lazy_adam.LazyShAdam where the SH Adam of unseen Gaussians waits

    @property
    def num(self) -> int:
        """Gaussians in this shard."""
        return int(self.params["means"].shape[0])

    def defer_sh_adam(self, max_count: int, unseen_zeros: bool = True) -> None:
        """From now on the training step defers the SH Adam of the Gaussians it does not see
        (--lazy_sh_adam; kernels/lazy_adam.py, up to Adam count ``max_count``; ``unseen_zeros``:
        its LazyRows'); :meth:`sync` catches them up."""
        from ..kernels.lazy_adam import LazyShAdam

        self.lazy = LazyShAdam(self.optimizers, self.num, max_count, self.params["means"].device, unseen_zeros)

    def sync(self) -> None:
        """Catch up the deferred SH Adam steps of every Gaussian (--lazy_sh_adam): afterwards the
        parameters and moments are the dense Adam's. Everything that reads or changes the
        Gaussians outside the training step calls it first (activated, state_dict, remove,
        export, densification's refinement steps). Parameters replaced wholesale (a test, a
        checkpoint) are taken as current."""
        if self.lazy is None:
            return
        if self.lazy.applied.numel() != self.num:
            self.rows_changed()
            return
        self.lazy.flush(self.params, self.optimizers)

    def rows_changed(self) -> None:
        """The Gaussians' rows were replaced, grown or cut after a :meth:`sync` (densification,
        pruning, a loaded checkpoint): every row is at the current Adam count."""
        if self.lazy is not None:
            self.lazy.reset(self.optimizers, self.num)

    def activated(self) -> dict[str, torch.Tensor]:
        """The Gaussians as the renderer takes them (model.activated), deferred steps caught up."""
        from .model import activated

        self.sync()
        return activated(self.params)

    def sizes_changed(self) -> None:
        """Say that the shards may have changed size on some rank (densification, pruning, a
        loaded checkpoint): the next step gathers every rank's count again. Every rank calls it
        at the same points of the run."""
        self.world_sizes = None

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """params, optimizers, scheduler and strategy_state, as a checkpoint stores them (the
        deferred SH Adam steps caught up first: a checkpoint holds the dense Adam's state)."""
        self.sync()
        return dict(
            params={k: v.detach() for k, v in self.params.items()},
            optimizers={k: o.state_dict() for k, o in self.optimizers.items()},
            scheduler=self.scheduler.state_dict(),
            strategy_state=self.strategy_state,
        )

    def load_state_dict(self, state: dict, device: torch.device) -> None:
        """The parameters, Adam moments, schedule and strategy state of ``state`` (a checkpoint's,
        re-sharded for this rank by checkpoint.load_shard), on ``device``."""
        for name, value in state["params"].items():
            self.params[name] = torch.nn.Parameter(value.to(device).contiguous())
        for name, opt in self.optimizers.items():
            opt.param_groups[0]["params"] = [self.params[name]]
            opt.state.clear()
            opt.load_state_dict(state["optimizers"][name])
        self.scheduler.load_state_dict(state["scheduler"])
        self.strategy_state = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in state["strategy_state"].items()
        }
        self.sizes_changed()
        self.rows_changed()

    # ------------------------------------------------------------------ surgery
    @torch.no_grad()
    def remove(self, mask: torch.Tensor) -> int:
        """Remove the Gaussians where ``mask`` [N] bool is True from the parameters, their Adam
        moments (gsplat.strategy.ops.remove) and the strategy's per-Gaussian state. Returns the
        count."""
        self.sync()
        num = remove_gaussians(self.params, self.optimizers, self.strategy_state, mask)
        self.sizes_changed()
        self.rows_changed()
        return num

    @torch.no_grad()
    def reorder(self, order: torch.Tensor) -> None:
        """Put the Gaussians in ``order`` (int64 [N], a permutation: new row i is old row
        ``order[i]``): the parameters, their Adam moments and the strategy's per-Gaussian state,
        in place, so that every tensor keeps its storage (the optimizers, the captured step graphs
        and the gradient buffers stay valid). Deferred SH steps are caught up first. Raises
        ValueError where ``order`` is not of length N."""
        self.sync()
        n = self.num
        if order.shape != (n,):
            raise ValueError(f"reorder: an order of {n} rows expected, got shape {tuple(order.shape)}")
        order = order.to(self.params["means"].device)
        tensors = [p.data for p in self.params.values()]
        for name, p in self.params.items():
            if name in self.optimizers:
                tensors += self.optimizers[name].state.get(p, {}).values()
        tensors += [self.strategy_state.get(key) for key in PER_GAUSSIAN_STATE]
        for t in tensors:  # what has a row per Gaussian: not Adam's step count, not MCMC's table
            if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == n:
                permute_rows_(t, order)
        self.rows_changed()


PERMUTE_BLOCK = 4
"""Columns per gather in :func:`permute_rows_`: its scratch is N x PERMUTE_BLOCK elements."""


@torch.no_grad()
def permute_rows_(t: torch.Tensor, order: torch.Tensor) -> None:
    """t[i] = t[order[i]] for every row of ``t`` [N, ...] (contiguous), in place, a few columns at a
    time (:data:`PERMUTE_BLOCK`), so the scratch is N x PERMUTE_BLOCK elements, not a second ``t``."""
    if t.numel() == 0:  # no rows (an empty shard) or rows of no elements (shN at SH degree 0)
        return
    flat = t.view(t.shape[0], -1)
    for c in range(0, flat.shape[1], PERMUTE_BLOCK):
        flat[:, c : c + PERMUTE_BLOCK] = flat[order, c : c + PERMUTE_BLOCK]


@torch.no_grad()
def remove_gaussians(params, optimizers: dict, strategy_state: dict, mask: torch.Tensor) -> int:
    """Remove the Gaussians where ``mask`` [N] bool is True from ``params``, their Adam moments
    and the per-Gaussian entries of ``strategy_state`` (:data:`PER_GAUSSIAN_STATE`). Returns the
    count."""
    from gsplat.strategy.ops import remove

    n = int(params["means"].shape[0])
    assert mask.shape == (n,) and mask.dtype == torch.bool
    num = int(mask.sum())
    if num == 0:
        return 0
    rows = {k: v for k, v in strategy_state.items() if k in PER_GAUSSIAN_STATE and isinstance(v, torch.Tensor)}
    assert all(v.shape[0] == n for v in rows.values()), {k: tuple(v.shape) for k, v in rows.items()}
    remove(params=params, optimizers=optimizers, state=rows, mask=mask)
    strategy_state.update(rows)
    return num
