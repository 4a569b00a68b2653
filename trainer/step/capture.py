"""CUDA-graph replay of a training step's static-shape head: activation, projection and SH colours.

Between two changes of the shard (densification, pruning, an opacity reset), of the SH degree in
use or of the image size, the owner's half of a dense pass (render.project_and_shade, with the
parameters' activations of model.activated before it) has fixed shapes, no data-dependent size
and no host synchronization. :class:`GraphedHead` captures it once per such shape (a forward
graph and a backward graph sharing one memory pool, :func:`capture_graphs`) and replays it every
step: its few dozen PyTorch operators and gsplat launches, forward and backward, become two graph
launches, which is host time a host-bound step gets back.

Where it applies (step/plan.py decides for the run, step/forward.py for each step): a CUDA device,
the dense layout (``--packed``'s record count is data-dependent) and one image size for every
camera of the pass (several sizes are projected in groups indexed from the host). Elsewhere the
same function runs eagerly. A replay runs the same
kernels on the same inputs: its outputs equal the eager pass's bit for bit, its gradients to
rounding (gsplat's projection backward sums over cameras with atomics; tests/test_gpu.py).

The replay's contract (that of ``torch.cuda.make_graphed_callables``): the parameters are the
graph's own input buffers (the optimizer updates them in place, so no copy is needed; a parameter
replaced by a new tensor changes the key and is captured again), the cameras are copied into
static buffers every step, and the outputs are static buffers overwritten by the next replay (a
step reads them only within itself). Why not that function itself: it defines a new autograd
Function class per capture and keeps the graphs in its methods' closures; a class is always in a
reference cycle, so every superseded capture's graphs and memory pool lived until the next full
garbage collection (docs/performance.md, "Tried and not kept"). Here one module-level Function replays a :class:`CapturedGraphs`, freed as soon as the step that
last used it is. Its static inputs hold the parameters' storage while it lives, which keeps the
key's data_ptr sound: a new parameter cannot reuse the address of one a live capture reads.
"""

from __future__ import annotations

import contextlib
import gc
import time
import warnings
from functools import partial
from typing import Callable, Mapping, Optional

import torch

from ...kernels.projection import project_and_shade_fused
from ..model import activated
from ..render import project_and_shade

PARAM_KEYS = ("means", "quats", "scales", "opacities", "sh0", "shN")
OUTPUT_KEYS = ("radii", "means2d", "depths", "conics", "opacities", "colors")


DEAD_POOL_SLACK = 1 << 30  # bytes the caching allocator may hold unused before a capture empties it


def release_dead_pools() -> None:
    """Before a capture: empty the caching allocator when it holds more than DEAD_POOL_SLACK
    bytes (or 1/16 of the device, if less) reserved but unused. A superseded capture's memory
    pool, once its graphs are gone, is only marked freeable: it returns to the device at the next
    ``torch.cuda.empty_cache()``, or when an allocation outside a capture fails (one inside a
    capture cannot free it). Emptying at every capture (what ``torch.cuda.graph`` does) bounds
    that but frees the eager steps' cached blocks too, at a device synchronization per block,
    and the steps after it allocate them again; with a slack, a run that captures at every
    densification empties the cache only when the dead pools add up."""
    device = torch.cuda.current_device()
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if unused > min(DEAD_POOL_SLACK, torch.cuda.get_device_properties(device).total_memory // 16):
        torch.cuda.empty_cache()


class CapturedGraphs:
    """A function's forward and backward, captured as two CUDA graphs on one memory pool.

    ``inputs``: the static input tensors, autograd leaves (those with requires_grad get
    gradients); ``outputs``: the static outputs; ``grad_outputs``: the static buffers the backward
    reads the gradients of the differentiable outputs from; ``grad_inputs``: where it leaves the
    inputs' gradients (None for inputs without requires_grad, and for those the function's
    backward gives none: parameters a backward with Adam steps in place). Raises what CUDA raises when it
    refuses the capture (torch.AcceleratorError, a RuntimeError).

    Both captures run on a side stream after one device synchronization and
    :func:`release_dead_pools`."""

    def __init__(self, fn: Callable, inputs: tuple):
        pool = torch.cuda.graph_pool_handle()
        self.forward, self.backward = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        self.inputs = inputs
        torch.cuda.synchronize()
        release_dead_pools()
        stream = torch.cuda.Stream()
        self.outputs = tuple(_captured(self.forward, pool, stream, lambda: fn(*inputs)))
        differentiable = [o for o in self.outputs if o.requires_grad]
        self.grad_outputs = tuple(torch.empty_like(o) for o in differentiable)
        wanted = [i for i in inputs if i.requires_grad]
        grads = iter(
            _captured(
                self.backward,
                pool,
                stream,
                lambda: torch.autograd.grad(differentiable, wanted, self.grad_outputs, allow_unused=True),
            )
        )
        self.grad_inputs = tuple(next(grads) if i.requires_grad else None for i in inputs)

    def __call__(self, *inputs: torch.Tensor) -> tuple:
        return _Replay.apply(self, *inputs)

    def replay_forward(self, *inputs: torch.Tensor) -> tuple:
        """Copy ``inputs`` into the static inputs (unless they are the same memory), replay the
        forward graph; returns the static outputs (overwritten by the next replay)."""
        for static, x in zip(self.inputs, inputs):
            if static.data_ptr() != x.data_ptr():
                static.copy_(x)
        self.forward.replay()
        return self.outputs

    def replay_backward(self, grads: Optional[tuple] = None) -> tuple:
        """Replay the backward graph; returns the static ``grad_inputs``. ``grads`` (aligned with
        ``grad_outputs``, None for a zero gradient) are copied in first; without them the
        static ``grad_outputs`` are read as they are (a graph that wrote them itself)."""
        if grads is not None:
            for static, g in zip(self.grad_outputs, grads):
                if g is None:
                    static.zero_()
                elif static.data_ptr() != g.data_ptr():
                    static.copy_(g)
        self.backward.replay()
        return self.grad_inputs


class CapturedCall:
    """``fn(*inputs)`` captured as one CUDA graph on a memory pool of its own: work that takes its
    own gradients (``torch.autograd.grad`` inside ``fn``), so no autograd node outlives it.
    ``replay()`` runs it again on what the static ``inputs`` hold now and returns the static
    ``outputs``. Captured as :class:`CapturedGraphs` captures (side stream, the device cache
    emptied first); raises what CUDA raises when it refuses the capture."""

    def __init__(self, fn: Callable, inputs: tuple):
        self.graph, self.inputs = torch.cuda.CUDAGraph(), inputs
        torch.cuda.synchronize()
        release_dead_pools()
        pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        self.outputs = tuple(_captured(self.graph, pool, stream, lambda: fn(*inputs)))

    def replay(self) -> tuple:
        self.graph.replay()
        return self.outputs


def _captured(graph: torch.cuda.CUDAGraph, pool, stream: torch.cuda.Stream, work: Callable):
    """``work()``'s launches captured into ``graph`` (memory from ``pool``) on ``stream``; returns
    what ``work`` returns. The capture always ends, also when ``work`` raises."""
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool)
        try:
            out = work()
        except BaseException:
            try:
                graph.capture_end()  # end the invalidated capture; its own error would hide work's
            except RuntimeError:
                pass
            raise
        graph.capture_end()
        return out


class _Replay(torch.autograd.Function):
    """Forward: copy the inputs into the static ones (unless they are the same memory), replay
    the forward graph, return the static outputs; backward: copy the incoming gradients into the
    static ones (zeros where none came), replay the backward graph, return the inputs' gradients.
    Those gradients share the static buffers' memory (autograd may keep them as the parameters'
    ``.grad``): the next replay overwrites them, so a step must consume them (the optimizer) and
    drop them (``grad = None``, as model.optimizer_step does) before the next backward; summing
    two backward passes in one ``.grad`` is not supported (torch.cuda.make_graphed_callables
    returns its static buffers the same way)."""

    @staticmethod
    def forward(ctx, graphs: CapturedGraphs, *inputs):
        ctx.graphs = graphs
        return tuple(o.detach() for o in graphs.replay_forward(*inputs))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        graphs: CapturedGraphs = ctx.graphs
        incoming = tuple(g for o, g in zip(graphs.outputs, grads) if o.requires_grad)
        grad_inputs = graphs.replay_backward(incoming)
        return (None, *(g.detach() if g is not None else None for g in grad_inputs))


@contextlib.contextmanager
def collector_held():
    """The garbage collector off for the block (a capture): a graph kept alive only by some
    reference cycle must not be destroyed mid-capture, where freeing its memory pool is an
    operation CUDA refuses ("operation not permitted when stream is capturing")."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def capture_graphs(fn: Callable, inputs: tuple) -> CapturedGraphs:
    """:class:`CapturedGraphs` of ``fn`` on ``inputs`` (the capture a :class:`GraphedHead` makes
    unless given another)."""
    return CapturedGraphs(fn, inputs)


def head_function(
    ops, sizes, sh_degree, near, far, camera_model, antialiased, projection="gsplat", adam=None, lazy=None
) -> Callable:
    """The captured function: (means, quats, scales, opacities, sh0, shN — raw parameters —,
    viewmats, Ks, campos) -> the tensors of :data:`OUTPUT_KEYS`, dense [C_all, N, ...].
    ``projection`` (StepPlan.projection): "triton", kernels/projection.py's fused kernels (one
    image size; ``adam``, a kernels.projection.AdamStep: their backward steps the parameters;
    ``lazy``, a kernels.lazy_adam.LazyRows: their forward lists the Gaussians it sees and
    catches their SH rows up); "gsplat", model.activated + render.project_and_shade with ``ops``.
    Raises ValueError for ``lazy`` with the gsplat projection (the step's Adam would read a list
    no forward wrote)."""
    if lazy is not None and projection != "triton":
        raise ValueError("head_function: lazy (--lazy_sh_adam) needs the Triton projection, which lists the rows seen")

    def head(means, quats, scales, opacities, sh0, shN, viewmats, Ks, campos):
        raw = dict(means=means, quats=quats, scales=scales, opacities=opacities, sh0=sh0, shN=shN)
        if projection == "triton":
            ((width, height),) = set(sizes)
            out = project_and_shade_fused(
                raw, viewmats, Ks, campos, width, height, sh_degree, near, far, camera_model, antialiased, adam, lazy
            )
        else:
            out = project_and_shade(
                ops, activated(raw), viewmats, Ks, campos, sizes, sh_degree, near, far, False, camera_model, antialiased
            )
        return tuple(out[k] for k in OUTPUT_KEYS)

    return head


def eager_head(
    params: Mapping[str, torch.Tensor],
    near: float,
    far: float,
    camera_model: str,
    antialiased: bool,
    adam=None,
    lazy=None,
):
    """render.render's ``head`` for kernels/projection.py's kernels without a capture (steps that
    run eagerly: several processes, --cuda_graphs off): (viewmats, Ks, campos, sizes, sh_degree)
    -> {output: tensor}, one image size; ``adam`` (kernels.projection.AdamStep): the backward
    steps the parameters; ``lazy`` (kernels.lazy_adam.LazyRows): the forward catches the SH rows
    it sees up."""

    def head(viewmats, Ks, campos, sizes, sh_degree):
        ((width, height),) = set(sizes)
        return project_and_shade_fused(
            params, viewmats, Ks, campos, width, height, sh_degree, near, far, camera_model, antialiased, adam, lazy
        )

    return head


class Uncaptured:
    """What stands where a capture cannot: ``replay()`` runs ``fn(*inputs())`` eagerly (a fused
    kernel too large for one launch, whose host reads no capture allows; a capture the backend
    refused)."""

    def __init__(self, fn: Callable, inputs: Callable[[], tuple] = tuple):
        self.fn, self.inputs = fn, inputs

    def replay(self):
        return self.fn(*self.inputs())


class CaptureBudget:
    """The rule that stops captures whose shapes change too often to repay them (a capture costs a
    warm-up, the capture itself and a memory pool): the capture that would be the ``most``-th
    within ``window`` calls is refused, and the owner stops capturing for the rest of the run."""

    def __init__(self, most: int, window: int):
        self.most, self.window = most, window
        self._recent: list[int] = []  # the call numbers of the latest captures

    def spend(self, call: int) -> bool:
        """Count a capture at call number ``call``; False when it would be the last straw."""
        self._recent = [c for c in self._recent if c > call - self.window]
        if len(self._recent) >= self.most - 1:
            return False
        self._recent.append(call)
        return True


class GraphedHead:
    """Activation + projection + SH of a dense pass, forward and backward, as CUDA graphs.

    ``ops``: the projection backend (gsplat's CUDA ops); ``near``, ``far`` (scene units),
    ``camera_model``, ``antialiased``: as render.render; ``projection``: as :func:`head_function`. ``capture``: what turns the function and
    its static inputs into a replayable callable (:func:`capture_graphs`; tests substitute a
    counting stand-in). One capture is used at a time; a new key drops this object's reference to
    the old one, which is freed when the last step that replayed it is.

    ``head(params)`` binds it to the trainer's parameters (a mapping of :data:`PARAM_KEYS`), giving
    render.render's ``head`` argument: (viewmats [C_all, 4, 4], Ks [C_all, 3, 3], campos [C_all, 3],
    sizes, sh_degree) -> {output: tensor}. ``captures`` counts the captures so far.

    A capture that fails (CUDA refuses something the captured work or another thread did) does not
    end the run: ``warn`` (a callable taking one line; default: the warnings module) is told why,
    once, the shape runs eagerly until the key changes, and ``failures`` counts it.

    Shapes that change too often to be worth capturing (``most_captures`` captures within
    ``window`` calls, e.g. a batch-1 dataset of portrait and landscape images) stop the captures for
    the rest of the run, with one line through ``warn``; ``stopped`` says so. A capture costs a
    warm-up pass and the capture itself (tens of ms of host time) and a memory pool of its own, so it
    pays only when replayed many times.
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
        projection: str = "gsplat",
        backward_adam=None,
        lazy_rows: Optional[Callable] = None,
    ):
        self.ops, self.near, self.far = ops, near, far
        self.backward_adam = backward_adam  # step/backward_adam.BackwardAdam, or None
        self.lazy_rows = lazy_rows  # () -> kernels.lazy_adam.LazyRows (--lazy_sh_adam), or None
        self.camera_model, self.antialiased, self.projection = camera_model, antialiased, projection
        self.capture = capture or capture_graphs
        self.warn = warn
        self.captures = self.failures = self.calls = 0
        self.stopped = False  # the shapes changed too often: no more captures in this run
        self._budget = CaptureBudget(self.most_captures, self.window)
        self.capture_seconds = 0.0  # host time of the successful captures, warm-up included
        self._key: Optional[tuple] = None
        self._replay: Optional[Callable] = None
        self._eager: Optional[Callable] = None  # the function of a key whose capture failed
        self._warmed: set = set()  # the keys, less the parameters, of the successful captures

    def _capture(self, fn: Callable, tensors: tuple, cams: tuple, warm_up: bool = True) -> Callable:
        """Warm ``fn`` up once eagerly (lazy loading and first-call work stay out of the capture;
        ``warm_up`` False skips it where the same sizes, SH degree and camera count were warmed
        up before, so only the Gaussian count or a parameter tensor changed), then capture it on inputs that are new autograd leaves: the parameters' storage under new
        leaves (same data_ptr, so a replay copies nothing) and copies of the cameras (a replay
        writes each step's cameras into them). New leaves matter: a parameter's AccumulateGrad
        node may still be alive from an earlier step's graph, bound to the default stream, and a
        backward captured through it would make the legacy stream wait on the capture (CUDA's
        "operation would make the legacy stream depend on a capturing blocking stream"). Without
        a warm-up on a side stream for the same reason: the leaves' nodes would be bound to that
        stream (torch.cuda.make_graphed_callables warms up on one). The garbage collector is held off
        during the capture: a graph that some reference cycle still keeps alive must not be
        destroyed mid-capture, where freeing its memory pool is an operation CUDA refuses
        ("operation not permitted when stream is capturing", seen on the H200 at a densification
        step with make_graphed_callables' captures)."""

        def leaves():
            return tuple(t.detach().requires_grad_(t.requires_grad) for t in tensors) + tuple(
                c.detach().clone().requires_grad_(c.requires_grad) for c in cams
            )

        if warm_up:  # with Adam in the backward, its constants are those of an update that changes nothing
            frozen = self.backward_adam.frozen() if self.backward_adam is not None else contextlib.nullcontext()
            with frozen:
                warm = leaves()
                outputs = [o for o in fn(*warm) if o.requires_grad]
                wanted = [t for t in warm if t.requires_grad]
                torch.autograd.grad(outputs, wanted, [torch.ones_like(o) for o in outputs], allow_unused=True)
                del warm, outputs, wanted
        if tensors[0].is_cuda:
            torch.cuda.synchronize(tensors[0].device)
        with collector_held():
            return self.capture(fn, leaves())

    def head(self, params: Mapping[str, torch.Tensor]) -> Callable:
        return partial(self, params)

    def __call__(self, params, viewmats, Ks, campos, sizes, sh_degree) -> dict[str, torch.Tensor]:
        run, inputs = self.prepare(params, viewmats, Ks, campos, sizes, sh_degree)
        return dict(zip(OUTPUT_KEYS, run(*inputs)))

    def key_of(self, params, viewmats, Ks, campos, sizes, sh_degree) -> tuple:
        """What a capture is valid for: sizes, SH degree, the parameters' storage, shapes and
        requires_grad, the cameras' shapes (and with Adam in the backward, the storage of the
        moments it steps; with --lazy_sh_adam, the storage of the SH rows' counts and moments)."""
        adam = self.backward_adam.step if self.backward_adam is not None else None
        return (
            tuple(sizes),
            sh_degree,
            tuple((params[k].data_ptr(), tuple(params[k].shape), params[k].requires_grad) for k in PARAM_KEYS),
            tuple((tuple(c.shape), c.requires_grad) for c in (viewmats, Ks, campos)),
            adam.key() if adam is not None else None,
            self.lazy_rows().key() if self.lazy_rows is not None else None,
        )

    def is_current(self, key: tuple) -> bool:
        """Whether :meth:`prepare` for ``key`` (:meth:`key_of`) would use what it prepared last
        (no new capture)."""
        return key == self._key

    def prepare(self, params, viewmats, Ks, campos, sizes, sh_degree, key=None) -> tuple[Callable, tuple]:
        """(what runs the head for these arguments, its inputs): the capture of their key (a
        :class:`CapturedGraphs` unless ``capture`` made something else), captured now when the
        key is new, or the eager function where captures failed or stopped. Arguments as
        :meth:`__call__`'s; ``key``: their :meth:`key_of`, when the caller has it already."""
        tensors = tuple(params[k] for k in PARAM_KEYS)
        cams = (viewmats, Ks, campos)
        key = key if key is not None else self.key_of(params, viewmats, Ks, campos, sizes, sh_degree)
        self.calls += 1
        if key != self._key:
            self._replay = self._eager = None
            fn = head_function(
                self.ops,
                list(sizes),
                sh_degree,
                self.near,
                self.far,
                self.camera_model,
                self.antialiased,
                self.projection,
                self.backward_adam.step if self.backward_adam is not None else None,
                self.lazy_rows() if self.lazy_rows is not None else None,
            )
            self._key = key
            if not self.stopped and not self._budget.spend(self.calls):  # this would be the last straw
                self.stopped = True
                line = (
                    f"--cuda_graphs: the shapes changed {self.most_captures} times within {self.window} steps; "
                    "the rest of the run goes without graphs"
                )
                (self.warn or warnings.warn)(line)
            if self.stopped:
                self._eager = fn
            else:
                start = time.perf_counter()
                try:
                    # all but the parameters; whether Adam or the deferred SH rows run (other kernels' first launches)
                    warmed = (key[0], key[1], key[3], key[4] is not None, key[5] is not None)
                    self._replay = self._capture(fn, tensors, cams, warm_up=warmed not in self._warmed)
                    self._warmed.add(warmed)
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
        return run, (*tensors, *cams)
