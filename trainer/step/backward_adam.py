"""The Gaussians' Adam step inside the projection's backward kernel (``--fused_adam``).

kernels/projection.py's per-Gaussian backward can take each Gaussian's Adam step where it has
the gradient (:class:`kernels.projection.AdamStep`) instead of writing the gradient for
kernels/adam.py's launch to read back: at SH degree 3 that leaves out 236 bytes per Gaussian
written and read again per step, and the gradients' memory. :class:`BackwardAdam` keeps the
trainer's side of it:

- :meth:`BackwardAdam.prepare`, before a step's forward: the step's constants from the Adams
  (learning rates after the scheduler, the next step count) into a device tensor the kernel
  reads at run time (so a CUDA-graph replay reads each step's), and the Adams' moment tensors
  (their state, torch's format, made on first use as torch makes it);
- :meth:`BackwardAdam.commit`, after the backward: when the kernel stepped (no parameter has a
  gradient) the step counts advance, as kernels/adam.py's launch advances them; when the step
  took another projection (cameras of several sizes in one step, where the kernels do not run)
  the parameters have gradients and the caller steps them as usual;
- :meth:`BackwardAdam.frozen`: while a CUDA-graph capture warms the backward up, the constants
  of an update that changes nothing (step size 0, beta1 = beta2 = 1), so the warm-up pass does
  not step the model.

The update is kernels/adam.py's formula for formula, read in the same order, so a run with it
matches a run without it (tests/test_projection_kernel.py, tests/test_gpu.py); the step plan
(step/plan.py, ``adam_mode``) decides where it applies.
"""

from __future__ import annotations

import contextlib
from typing import Mapping, Optional

import torch

from ...kernels.adam import state_of, step_constants
from ...kernels.projection import PARAM_KEYS, AdamStep
from ..model import mark_stepped

# step size 0, 1/sqrt(bc2) 1, beta1 = beta2 = 1, eps 1: m, v and the parameter stay as they are
FROZEN = (0.0, 1.0, 1.0, 1.0, 1.0)


class BackwardAdam:
    """Adam of the six Gaussian parameters (:data:`kernels.projection.PARAM_KEYS`) taken by the
    projection's backward kernel; ``device``: the parameters' device; ``selective``: gsplat's
    SelectiveAdam (--visible_adam / --sparse_grad) instead of Adam."""

    def __init__(self, device, selective: bool = False):
        self.hyper = torch.zeros(len(PARAM_KEYS), 5, dtype=torch.float32, device=device)
        self.selective = selective
        self.step: Optional[AdamStep] = None  # what prepare made for the step under way
        self._rows: list[tuple] = []

    def _write(self, rows) -> None:
        values = torch.tensor(rows, dtype=torch.float32)
        if self.hyper.is_cuda:  # stream-ordered; torch keeps a pinned block until its copy ran
            values = values.pin_memory()
        self.hyper.copy_(values, non_blocking=True)

    def prepare(self, optimizers: Mapping[str, torch.optim.Adam]) -> AdamStep:
        """The step's :class:`AdamStep` (its constants written to the device): ``optimizers`` maps
        each key of PARAM_KEYS to its torch.optim.Adam of one parameter (model.create_optimizers).
        Call once per step, before its forward."""
        moments, rows = {}, []
        for k in PARAM_KEYS:
            opt = optimizers[k]
            ((group,),) = (opt.param_groups,)
            (p,) = group["params"]
            state = state_of(opt, p)
            beta1, beta2 = group["betas"]
            rows.append(
                (*step_constants(group, state, self.selective), float(beta1), float(beta2), float(group["eps"]))
            )
            moments[k] = (state["exp_avg"], state["exp_avg_sq"])
        self._rows = rows
        self._write(rows)
        self.step = AdamStep(moments, self.hyper, self.selective)
        return self.step

    def commit(self, optimizers: Mapping[str, torch.optim.Adam]) -> bool:
        """After the step's backward: True when the kernel took the step (no parameter has a
        gradient; the counts advance, selective ones as gsplat's do not), False when the
        parameters got gradients instead (the caller runs the optimizer)."""
        self.step = None
        params = [optimizers[k].param_groups[0]["params"][0] for k in PARAM_KEYS]
        if any(p.grad is not None for p in params):
            return False
        if not self.selective:
            for k, p in zip(PARAM_KEYS, params):
                optimizers[k].state[p]["step"] += 1
        mark_stepped([optimizers[k] for k in PARAM_KEYS])
        return True

    @contextlib.contextmanager
    def frozen(self):
        """The constants of an update that changes nothing for the block (a capture's warm-up
        pass), the step's after it."""
        self._write([FROZEN] * len(PARAM_KEYS))
        try:
            yield
        finally:
            if self._rows:
                self._write(self._rows)
