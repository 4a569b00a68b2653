"""One training step, in the order it runs.

- plan.py: :class:`StepPlan`, the run's one decision of which step it takes (rasterization,
  pass, CUDA graphs), with reasons;
- batch.py: :class:`StepBatch`, what a step trains on (views, targets, masks, windows, tile
  origin, every rank's cameras), built in one call;
- forward.py: :class:`ForwardBackward`, the step's forward, loss and backward as the plan says:
  graphed.py (the whole step replayed as CUDA graphs around the tile intersection; capture.py holds
  the capture machinery and the graphed projection head, graphed_exchange.py the record exchanges
  the distributed path's replay captures) or eager.py (autograd).

trainer/loop.py runs the rest of a step (optimizer, densification) and the run around it.
"""

from .batch import Batches, StepBatch
from .forward import ForwardBackward
from .graphed import StepOutputs
from .plan import StepPlan, plan_step

__all__ = ["Batches", "ForwardBackward", "StepBatch", "StepOutputs", "StepPlan", "plan_step"]
