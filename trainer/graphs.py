"""CUDA-graph replay of a training step's static-shape head: activation, projection and SH colours.

Between two changes of the shard (densification, pruning, an opacity reset), of the SH degree in
use or of the image size, the owner's half of a dense pass (render.project_and_shade, with the
parameters' activations of model.activated before it) has fixed shapes, no data-dependent size
and no host synchronization. :class:`GraphedHead` captures it once per such shape with
``torch.cuda.make_graphed_callables`` (a forward graph and a backward graph sharing one memory
pool) and replays it every step: its few dozen PyTorch operators and gsplat launches, forward and
backward, become two graph launches, which is host time a host-bound step gets back.

Where it applies (:func:`graphable`): a CUDA device, the dense layout (``--packed``'s record count is
data-dependent) and one image size for every camera of the pass (several sizes are projected in
groups indexed from the host). Elsewhere the same function runs eagerly. A replay runs the same
kernels on the same inputs: its outputs equal the eager pass's bit for bit, its gradients to
rounding (gsplat's projection backward sums over cameras with atomics; tests/test_gpu.py).

The replay's contract (``torch.cuda.make_graphed_callables``): the parameters are the graph's own
input buffers (the optimizer updates them in place, so no copy is needed; a parameter replaced by
a new tensor changes the key and is captured again), the cameras are copied into static buffers
every step, and the outputs are static buffers overwritten by the next replay (a step reads them
only within itself). A superseded capture is not freed when this module drops it: the autograd
Function class make_graphed_callables defines per capture sits in a reference cycle, so its graphs,
memory pool and static inputs live until Python's next full garbage collection. Those static
inputs hold the old parameters' storage, which is also what keeps the key's data_ptr sound: a new
parameter cannot reuse the address of one a live capture reads.
"""

from __future__ import annotations

import gc
import time
import warnings
from functools import partial
from typing import Callable, Mapping, Optional

import torch

from .model import activated
from .render import project_and_shade

PARAM_KEYS = ("means", "quats", "scales", "opacities", "sh0", "shN")
OUTPUT_KEYS = ("radii", "means2d", "depths", "conics", "opacities", "colors")


def graphable(device: torch.device, packed: bool, sizes: list[tuple[int, int]]) -> bool:
    """Whether a pass can replay :class:`GraphedHead`: CUDA, dense, one image size."""
    return device.type == "cuda" and not packed and len(set(sizes)) == 1


def head_function(ops, sizes, sh_degree, near, far, camera_model, antialiased) -> Callable:
    """The captured function: (means, quats, scales, opacities, sh0, shN — raw parameters —,
    viewmats, Ks, campos) -> the tensors of :data:`OUTPUT_KEYS`, dense [C_all, N, ...]."""

    def head(means, quats, scales, opacities, sh0, shN, viewmats, Ks, campos):
        gaussians = activated(dict(means=means, quats=quats, scales=scales, opacities=opacities, sh0=sh0, shN=shN))
        out = project_and_shade(
            ops, gaussians, viewmats, Ks, campos, sizes, sh_degree, near, far, False, camera_model, antialiased
        )
        return tuple(out[k] for k in OUTPUT_KEYS)

    return head


class GraphedHead:
    """Activation + projection + SH of a dense pass, forward and backward, as CUDA graphs.

    ``ops``: the projection backend (gsplat's CUDA ops); ``near``, ``far`` (scene units),
    ``camera_model``, ``antialiased``: as render.render. ``capture``: what turns the function and
    its sample inputs into a replayable callable (``torch.cuda.make_graphed_callables``; tests
    substitute a counting stand-in). One capture is used at a time; a new key drops this object's
    reference to the old one (freed at the next full garbage collection, see the module's text).

    ``head(params)`` binds it to the trainer's parameters (a mapping of :data:`PARAM_KEYS`), giving
    render.render's ``head`` argument: (viewmats [C_all, 4, 4], Ks [C_all, 3, 3], campos [C_all, 3],
    sizes, sh_degree) -> {output: tensor}. ``captures`` counts the captures so far.

    A capture that fails (CUDA refuses something the captured work or another thread did) does not
    end the run: ``warn`` (a callable taking one line; default: the warnings module) is told why,
    once, the shape runs eagerly until the key changes, and ``failures`` counts it.

    Shapes that change too often to be worth capturing (``most_captures`` captures within
    ``window`` calls, e.g. a batch-1 dataset of portrait and landscape images) stop the captures for
    the rest of the run, with one line through ``warn``; ``stopped`` says so. A capture costs a
    warm-up pass and the capture itself (tens of ms of host time) and holds memory until a full
    garbage collection, so it pays only when replayed many times.
    """

    most_captures, window = 8, 100

    def __init__(
        self,
        ops,
        near: float,
        far: float,
        camera_model: str = "pinhole",
        antialiased: bool = False,
        capture=None,
        warn: Optional[Callable[[str], None]] = None,
    ):
        self.ops, self.near, self.far = ops, near, far
        self.camera_model, self.antialiased = camera_model, antialiased
        self.capture = capture or torch.cuda.make_graphed_callables
        self.warn = warn
        self.captures = self.failures = self.calls = 0
        self.stopped = False  # the shapes changed too often: no more captures in this run
        self._recent: list[int] = []  # the call numbers of the latest captures
        self.capture_seconds = 0.0  # host time of the successful captures, warm-up included
        self._key: Optional[tuple] = None
        self._replay: Optional[Callable] = None
        self._eager: Optional[Callable] = None  # the function of a key whose capture failed

    def _capture(self, fn: Callable, tensors: tuple, cams: tuple) -> Callable:
        """Warm ``fn`` up once eagerly (lazy loading and first-call work stay out of the capture),
        then capture it on inputs that are new autograd leaves: the parameters' storage under new
        leaves (same data_ptr, so a replay copies nothing) and copies of the cameras (a replay
        writes each step's cameras into them). New leaves matter: a parameter's AccumulateGrad
        node may still be alive from an earlier step's graph, bound to the default stream, and a
        backward captured through it would make the legacy stream wait on the capture (CUDA's
        "operation would make the legacy stream depend on a capturing blocking stream"). Without
        make_graphed_callables' own warm-up on a side stream for the same reason: its leaves'
        nodes would be bound to that stream. The garbage collector is held off during the
        capture: an earlier capture's graphs kept alive by a reference cycle (the previous step's
        autograd graph) must not be destroyed mid-capture, where freeing their memory pool is an
        operation CUDA refuses ("operation not permitted when stream is capturing", seen on the
        H200 at a densification step); they go at a later collection."""

        def leaves():
            return tuple(t.detach().requires_grad_(t.requires_grad) for t in tensors) + tuple(
                c.detach().clone().requires_grad_(c.requires_grad) for c in cams
            )

        warm = leaves()
        outputs = [o for o in fn(*warm) if o.requires_grad]
        torch.autograd.grad(outputs, [t for t in warm if t.requires_grad], [torch.ones_like(o) for o in outputs])
        del warm, outputs
        if tensors[0].is_cuda:
            torch.cuda.synchronize(tensors[0].device)
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self.capture(fn, leaves(), num_warmup_iters=0)
        finally:
            if collecting:
                gc.enable()

    def head(self, params: Mapping[str, torch.Tensor]) -> Callable:
        return partial(self, params)

    def __call__(self, params, viewmats, Ks, campos, sizes, sh_degree) -> dict[str, torch.Tensor]:
        tensors = tuple(params[k] for k in PARAM_KEYS)
        cams = (viewmats, Ks, campos)
        key = (
            tuple(sizes),
            sh_degree,
            tuple((t.data_ptr(), tuple(t.shape), t.requires_grad) for t in tensors),
            tuple((tuple(c.shape), c.requires_grad) for c in cams),
        )
        self.calls += 1
        if key != self._key:
            self._replay = self._eager = None
            fn = head_function(
                self.ops, list(sizes), sh_degree, self.near, self.far, self.camera_model, self.antialiased
            )
            self._key = key
            self._recent = [c for c in self._recent if c > self.calls - self.window]
            if not self.stopped and len(self._recent) >= self.most_captures - 1:  # this would be the last straw
                self.stopped = True
                line = (
                    f"--cuda_graphs: the shapes changed {self.most_captures} times within {self.window} steps; "
                    "the rest of the run goes without graphs"
                )
                (self.warn or warnings.warn)(line)
            if self.stopped:
                self._eager = fn
            else:
                self._recent.append(self.calls)
                start = time.perf_counter()
                try:
                    self._replay = self._capture(fn, tensors, cams)
                    self.captures += 1
                    self.capture_seconds += time.perf_counter() - start
                except RuntimeError as e:  # torch.AcceleratorError is one
                    self._eager = fn
                    self.failures += 1
                    if self.failures == 1:
                        line = (
                            f"--cuda_graphs: a capture failed, its shapes run without graphs ({str(e).splitlines()[0]})"
                        )
                        (self.warn or warnings.warn)(line)
        run = self._replay or self._eager
        assert run is not None
        return dict(zip(OUTPUT_KEYS, run(*tensors, *cams)))
