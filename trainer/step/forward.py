"""A training step's forward, loss and backward as the run's StepPlan says: :class:`ForwardBackward`.

It holds the run's CUDA-graph state (the graphed head and the whole-step replay, made when the plan
has graphs) and the eager step, and picks one for each step from what only the step's data can
say: a step whose images carry loss masks or whose cameras differ in size runs eagerly; a step
the whole-step replay declines (a capture failed, the fused kernel would need several launches)
too. The optimizer, densification and everything after them are trainer/loop.py's.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..render import RenderSetup
from .backward_adam import BackwardAdam
from .batch import StepBatch
from .capture import GraphedHead, eager_head
from .eager import EagerStep
from .graphed import GraphedStep, StepOutputs
from .plan import StepPlan


class ForwardBackward:
    """``forward_backward(batch, params, sh_degree, timer)``: one step's forward, loss and backward
    (the parameters' ``.grad`` set; with graphs, static buffers the optimizer must consume and
    drop before the next step). Returns step/graphed.StepOutputs, whose tensors a graphed step
    overwrites at the next one: read them before it.

    ``plan``: the run's StepPlan; ``cfg``, ``setup`` (the training passes' RenderSetup), ``loss``
    (losses.TrainingLoss), ``aux``, ``depth_targets``, ``scene_scale``, ``tb_wanted``: as
    step/eager.EagerStep's; ``warn``: one-line warnings (a capture that failed); ``backward_adam``
    (step/backward_adam.BackwardAdam, the plan's ``fused_adam``): the projection's backward steps
    the parameters (prepared by the caller before each step) and leaves them no ``.grad``;
    ``lazy_rows`` (--lazy_sh_adam): () -> the kernels.lazy_adam.LazyRows the Triton projection's
    forward catches the SH rows it sees up with, and ``lazy_sync``: () -> None, which catches every
    row up before a step that takes another projection; after each call ``lazy_listed`` says
    whether the step's forward listed the Gaussians it saw (LazyRows.seen: the SH rows the step's
    Adam takes) or every row was caught up instead (the SH Adam then steps them all). ``graphed_head``
    and ``graphed_step`` (None where the plan has none; tests may set their own) are public."""

    def __init__(
        self,
        plan: StepPlan,
        cfg,
        setup: RenderSetup,
        loss: Callable,
        aux: dict,
        depth_targets=None,
        scene_scale: float = 1.0,
        tb_wanted: Callable[[int], bool] = lambda step: False,
        warn: Optional[Callable[[str], None]] = None,
        backward_adam: Optional[BackwardAdam] = None,
        lazy_rows: Optional[Callable] = None,
        lazy_sync: Optional[Callable[[], None]] = None,
    ):
        self.plan = plan
        self.backward_adam = backward_adam
        self.lazy_rows, self.lazy_sync = lazy_rows, lazy_sync
        self.lazy_listed = False
        self.eager = EagerStep(plan, cfg, setup, loss, aux, depth_targets, scene_scale, tb_wanted)
        self.graphed_head: Optional[GraphedHead] = (
            GraphedHead(
                setup.ops,
                setup.near,
                setup.far,
                **setup.options,
                warn=warn,
                projection=plan.projection,
                backward_adam=backward_adam,
                lazy_rows=lazy_rows,
            )
            if plan.graphs != "off"
            else None
        )
        self.setup = setup
        self.graphed_step: Optional[GraphedStep] = (
            GraphedStep(
                self.graphed_head,
                setup.ops,
                loss,
                setup.absgrad,
                warn=warn,
                fused=self.eager.fused_loss,
                ctx=setup.ctx,
                scratch_mb=plan.fused_scratch_mb,
            )
            if self.graphed_head is not None and plan.graphs == "whole"
            else None
        )

    def defer_sh_adam(self, lazy_rows: Callable, lazy_sync: Callable[[], None]) -> None:
        """From the next step on, the Triton projection's forward lists the Gaussians it sees and
        catches their SH rows up (``lazy_rows``, ``lazy_sync`` as the constructor's): the SH Adam
        of the others waits. The graphed head captures again (its key holds the rows' storage)."""
        self.lazy_rows, self.lazy_sync = lazy_rows, lazy_sync
        if self.graphed_head is not None:
            self.graphed_head.lazy_rows = lazy_rows

    def __call__(self, batch: StepBatch, params, sh_degree: int, timer) -> StepOutputs:
        one_size = batch.one_size()
        self.lazy_listed = self.lazy_rows is not None  # the Triton projection's forward lists them
        if self.graphed_step is not None and batch.keep is None and one_size:
            layout = batch.layout
            assert layout is not None and layout.viewmats is not None  # a whole-step plan: cameras not learned
            out = self.graphed_step(
                params,
                layout.viewmats,
                layout.Ks,
                layout.campos,
                batch.cams.width,
                batch.cams.height,
                sh_degree,
                batch.gts,
                batch.backgrounds,
                timer,
                layout.N_world,
                layout.C_world,
            )  # None: this step runs eagerly (step/graphed.py)
            if out is not None:
                return out
        head = None
        if self.graphed_head is not None and one_size:
            head = self.graphed_head.head(params)
        elif self.plan.projection == "triton" and one_size:  # the same kernels, without a capture
            s = self.setup
            adam = self.backward_adam.step if self.backward_adam is not None else None
            lazy = self.lazy_rows() if self.lazy_rows is not None else None
            head = eager_head(params, s.near, s.far, **s.options, adam=adam, lazy=lazy)
        if head is None and self.lazy_sync is not None:  # another projection reads every SH row
            self.lazy_sync()
            self.lazy_listed = False
        return self.eager(batch, params, sh_degree, timer, head=head)

    def release(self) -> None:
        """Free the whole-step replay's captures: its record exchange's captured collectives must
        be gone before the process group is destroyed (step/graphed_exchange.py). Idempotent; a
        later step captures again."""
        if self.graphed_step is not None:
            self.graphed_step.release()

    def take_tb_image(self):
        """The last step's ground truth | render for TensorBoard (--tb_save_image), once; or None."""
        image, self.eager.tb_image = self.eager.tb_image, None
        return image

    def graphs_summary(self) -> str:
        """The train loop's CUDA-graph line: captures, their time, failures, and the steps the
        whole-step replay left to the eager step (empty without graphs)."""
        head, whole = self.graphed_head, self.graphed_step
        if head is None:
            return ""
        line = f"cuda graphs: {head.captures} captures in {head.capture_seconds:.2f} s, {head.failures} failed"
        if head.stopped:
            line += " (then stopped: the shapes changed too often)"
        if whole is not None:
            line += (
                f"; whole steps: {whole.captures} tail captures in {whole.capture_seconds:.2f} s, "
                f"{whole.failures} failed"
            )
            if whole.ctx is not None:
                line += f", {whole.exchange_captures} record exchanges captured"
                if whole.exchange_stopped:
                    line += " (then stopped: the pass layout changed too often)"
            if whole.declined:
                line += f", {whole.declined} steps too large for one fused launch ran their tail uncaptured"
        return line
