"""kernels/prewarm.py: the projection's launches at the SH degrees a run reaches later are compiled
in the background, once each, lowest degree first, from dtypes alone; on a GPU (``-m gpu``, in a
child process with an empty Triton cache) the training thread's later launches at those degrees
then find them compiled."""

import os
import subprocess
import sys

import pytest
import torch

from splat_train.kernels import prewarm

CUDA = torch.device("cuda", 0)


class FakeKernel:
    def __init__(self, fail_at=None):
        self.calls, self.fail_at = [], fail_at

    def warmup(self, *args, grid, **kw):
        self.calls.append((args, grid, kw))
        if kw.get("DEG") == self.fail_at:
            raise RuntimeError("does not compile")


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(prewarm, "enabled", lambda device: True)


def test_each_degree_is_compiled_once_lowest_first_from_dtypes(on):
    kernel = FakeKernel()
    args = [torch.zeros(5), torch.zeros(3, dtype=torch.int32), 1000, 480, 2.5]
    prewarm.ahead(kernel, args, dict(BLOCK=128, num_warps=4), "DEG", range(1, 4), CUDA)
    prewarm.ahead(kernel, args, dict(BLOCK=128, num_warps=4), "DEG", range(2, 4), CUDA)  # a later degree: queued before
    prewarm.wait()
    assert sorted(c[2]["DEG"] for c in kernel.calls) == [1, 2, 3]  # two workers: in either order
    for a, grid, kw in kernel.calls:
        assert a == (torch.float32, torch.int32, 1000, 480, 2.5) and grid == (1,)  # no tensor held
        assert kw["BLOCK"] == 128 and kw["num_warps"] == 4
    other = [torch.zeros(5), torch.zeros(3, dtype=torch.int32), 1000, 481, 2.5]  # W no longer a multiple of 16
    prewarm.ahead(kernel, other, dict(BLOCK=128, num_warps=4), "DEG", [3], CUDA)
    prewarm.ahead(kernel, args, dict(BLOCK=128, num_warps=4, AA=True), "DEG", [3], CUDA)  # another constexpr
    prewarm.ahead(
        kernel,
        [torch.zeros(9), torch.zeros(1, dtype=torch.int32), 3000, 96, 0.5],
        dict(BLOCK=128, num_warps=4),
        "DEG",
        [3],
        CUDA,
    )
    prewarm.wait()
    assert len(kernel.calls) == 5  # the last one differs only in values Triton does not specialize on


def test_a_compilation_that_fails_is_counted_and_the_rest_go_on(on):
    kernel = FakeKernel(fail_at=2)
    before = prewarm.stats()
    prewarm.ahead(kernel, [torch.zeros(1)], {}, "DEG", [1, 2, 3], CUDA)
    prewarm.wait()
    after = prewarm.stats()
    assert sorted(c[2]["DEG"] for c in kernel.calls) == [1, 2, 3]
    assert after["failed"] == before["failed"] + 1 and after["done"] == before["done"] + 3


def test_a_launch_at_a_queued_degree_waits_for_its_compilation(on):
    """settle(): the training thread does not compile beside a worker still compiling the same
    launch; a launch never queued does not wait."""
    import threading
    import time

    release = threading.Event()

    class Blocking(FakeKernel):
        def warmup(self, *args, grid, **kw):
            release.wait(10)
            super().warmup(*args, grid=grid, **kw)

    kernel = Blocking()
    args = [torch.zeros(2), 64]
    prewarm.ahead(kernel, args, {}, "DEG", [1], CUDA)
    prewarm.settle(kernel, args, {}, "DEG", 0)  # not queued: returns at once
    threading.Timer(0.3, release.set).start()
    t0 = time.monotonic()
    prewarm.settle(kernel, args, {}, "DEG", 1)
    assert time.monotonic() - t0 >= 0.2 and [c[2]["DEG"] for c in kernel.calls] == [1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_nothing_queued_and_threads_of_its_own(on):
    import threading

    release = threading.Event()

    class Blocking(FakeKernel):
        def warmup(self, *args, grid, **kw):
            release.wait(10)
            super().warmup(*args, grid=grid, **kw)

    kernel = Blocking()
    prewarm.ahead(kernel, [torch.zeros(1), 7], {}, "DEG", [1], CUDA)  # in flight in the parent
    pid = os.fork()
    if pid == 0:  # the child: settle() must not wait for the parent's job, and ahead() works
        import signal

        signal.alarm(20)  # a settle() that waits for the parent's job ends the child: a failure, not a hang
        code = 1
        try:
            prewarm.settle(kernel, [torch.zeros(1), 7], {}, "DEG", 1)
            child = FakeKernel()
            prewarm.ahead(child, [torch.zeros(1)], {}, "DEG", [2], CUDA)
            prewarm.wait()
            code = 0 if [c[2]["DEG"] for c in child.calls] == [2] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    release.set()
    prewarm.wait()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_nothing_is_queued_off_a_gpu_under_the_interpreter_or_when_turned_off(monkeypatch):
    kernel = FakeKernel()
    prewarm.ahead(kernel, [torch.zeros(1)], {}, "DEG", [1], torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    prewarm.ahead(kernel, [torch.zeros(1)], {}, "DEG", [1], CUDA)
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv("SPLAT_TRAIN_PREWARM", "0")
    prewarm.ahead(kernel, [torch.zeros(1)], {}, "DEG", [1], CUDA)
    prewarm.wait()
    assert kernel.calls == []
    assert not prewarm.enabled(torch.device("cpu")) and not prewarm.enabled(CUDA)
    monkeypatch.delenv("SPLAT_TRAIN_PREWARM")
    assert prewarm.enabled(CUDA)


def _exit_child(marks: str) -> None:
    """Queues three slow compilations and exits while the first is in flight."""
    import time

    class Slow:
        def warmup(self, *args, grid, DEG):
            time.sleep(1.0)
            open(os.path.join(marks, f"deg{DEG}"), "w").close()

    prewarm.WORKERS = 1
    prewarm.enabled = lambda device: True
    prewarm.ahead(Slow(), [torch.zeros(1)], {}, "DEG", [1, 2, 3], CUDA)
    time.sleep(0.3)


def test_an_exiting_process_finishes_the_compilation_in_flight_and_drops_the_rest(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "exit", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["deg1"]


def _cached(kernel) -> int:
    """Kernels in Triton's in-memory cache of ``kernel`` for device 0 (Triton 3.x's layout)."""
    return len(kernel.device_caches[0][0])


def _gpu_child(out_path: str) -> None:
    from splat_train.kernels import projection

    gen = torch.Generator().manual_seed(0)
    N = 5000
    params = {
        "means": torch.randn(N, 3, generator=gen) * 2,
        "quats": torch.randn(N, 4, generator=gen),
        "scales": torch.rand(N, 3, generator=gen) * -3 - 2,
        "opacities": torch.randn(N, generator=gen),
        "sh0": torch.randn(N, 1, 3, generator=gen),
        "shN": torch.randn(N, 15, 3, generator=gen) * 0.1,
    }
    viewmats = torch.eye(4)[None].clone()
    viewmats[0, 2, 3] = 8.0
    Ks = torch.tensor([[[300.0, 0, 160], [0, 300.0, 120], [0, 0, 1]]])
    campos = torch.tensor([[0.0, 0.0, -8.0]])
    cams = [t.cuda() for t in (viewmats, Ks, campos)]

    def step(deg):
        leaves = {k: v.cuda().requires_grad_() for k, v in params.items()}
        out = projection.project_and_shade_fused(leaves, *cams, 320, 240, deg, 0.01, 1e10)
        loss = out["means2d"].sum() + out["colors"].sum() + out["conics"].sum() + out["opacities"].sum()
        loss.backward()
        torch.cuda.synchronize()

    kernels = (projection._forward_kernel, projection._backward_kernel)
    step(0)
    prewarm.wait()
    warmed = [_cached(k) for k in kernels]
    for deg in (1, 2, 3):
        step(deg)
    torch.save(dict(warmed=warmed, after=[_cached(k) for k in kernels], stats=prewarm.stats()), out_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
def test_the_training_threads_launches_at_higher_degrees_find_them_compiled(tmp_path):
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    env.pop("SPLAT_TRAIN_PREWARM", None)
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "gpu", str(tmp_path / "out.pt")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-5000:]
    got = torch.load(tmp_path / "out.pt")
    assert got["stats"]["failed"] == 0 and got["stats"]["done"] == got["stats"]["queued"] == 6, got
    assert got["warmed"] == [4, 4], got  # degree 0 by the training thread, 1-3 in the background
    assert got["after"] == got["warmed"], got  # the launches at 1-3 compiled nothing more


if __name__ == "__main__" and sys.argv[1:2] == ["gpu"]:
    _gpu_child(sys.argv[2])
if __name__ == "__main__" and sys.argv[1:2] == ["exit"]:
    _exit_child(sys.argv[2])
