"""trainer/data/views.py: the training images where the step reads them, streamed through a bounded
cache when asked."""

from pathlib import Path

import numpy as np
import pytest
import torch

from splat_train.trainer.data import CameraSampler, Dataset
from splat_train.trainer.data.synthetic import make_synthetic_scene
from splat_train.trainer.data import views as views_module
from splat_train.trainer.data.views import TrainViews


@pytest.fixture(scope="module")
def scene():
    return make_synthetic_scene(200, 24, 32, seed=1)


def test_host_views_are_the_decoded_images_and_cameras(scene):
    data = Dataset(scene, list(range(0, 24, 2)))
    views = TrainViews(data, torch.device("cpu"))
    assert views.where == "host" and len(views) == 12
    got = views.images_of([3, 5])
    assert got.dtype == torch.uint8 and got.shape == (2, 32, 32, 3)
    assert torch.equal(got[1], torch.from_numpy(scene.images[10]))
    c2w, Ks = views.cameras([5])
    assert torch.equal(c2w[0], torch.from_numpy(scene.cameras[10].camtoworld))
    assert torch.equal(views.item_ids([5, 3]), torch.tensor([5, 3]))


@pytest.mark.parametrize("batch_size,threads", [(1, 0), (2, 1)])
def test_streamed_views_stay_within_their_cache_and_match(scene, batch_size, threads):
    data = Dataset(scene, list(range(24)), preload=False)
    sampler = CameraSampler(data, batch_size, seed=3)
    image = 32 * 32 * 3
    views = TrainViews(
        data,
        torch.device("cpu"),
        host_cache_bytes=8 * image,
        items_at=sampler.batch_at,
        lookahead=16,
        decode_threads=threads,
    )
    assert views.where == "stream" and data._images is None
    assert views._pool._max_workers == (threads or views_module.DECODE_THREADS)  # --decode_threads
    for step in range(60):  # 2.5 epochs: images leave the cache and come back
        items = sampler.batch_at(step)
        got = views.images_of(items, step)
        want = torch.stack([torch.from_numpy(scene.images[data.indices[i]]) for i in items])
        assert torch.equal(got, want), step
    assert views.peak_cache_bytes <= 8 * image + batch_size * image  # the bound, plus one decode landing
    assert views.peak_cache_bytes >= 4 * image  # it did decode ahead
    assert views.decodes >= 24 and views.waits <= views.decodes  # every image at least once
    assert views.stream_summary().startswith(f"image cache: {views.decodes:,} decodes")
    views.close()


def test_negative_decode_threads_are_refused(scene):
    with pytest.raises(ValueError, match="--decode_threads"):
        TrainViews(Dataset(scene, list(range(4))), torch.device("cpu"), decode_threads=-1)


def test_a_cache_smaller_than_two_batches_is_refused(scene):
    data = Dataset(scene, list(range(24)), preload=False)
    sampler = CameraSampler(data, 2, seed=3)
    views = TrainViews(data, torch.device("cpu"), host_cache_bytes=3 * 32 * 32 * 3, items_at=sampler.batch_at)
    with pytest.raises(ValueError, match="--image_cache_gb"):
        views.images_of(sampler.batch_at(0), 0)
    views.close()


def test_training_from_a_bounded_cache_equals_training_from_memory(tmp_path):
    """Five steps with images streamed through a cache of a few images equal five steps with every
    image decoded up front (bitwise), and the run says how its images are read."""
    from splat_train.trainer.cli import build_scene, parse_args
    from splat_train.trainer.launch import DistContext
    from splat_train.trainer.loop import Trainer

    flags = [
        "default",
        "--synthetic_image_size",
        "32",
        "--synthetic_num_cameras",
        "12",
        "--synthetic_num_gaussians",
        "100",
        "--sh_degree",
        "0",
        "--result_dir",
        str(tmp_path),
    ]
    params = []
    for extra in ([], ["--image_cache_gb", str(6 * 32 * 32 * 3 / 2**30)]):
        cfg = parse_args([*flags, *extra])
        trainer = Trainer(cfg, DistContext(), build_scene(cfg))
        assert trainer.views.where == ("stream" if extra else "host")
        for step in range(5):
            trainer.train_step(step)
        params.append({k: v.detach().clone() for k, v in trainer.params.items()})
        trainer.views.close()
    for k in params[0]:
        assert torch.equal(params[0][k], params[1][k]), k


def test_describe_views_names_the_cache(tmp_path):
    from splat_train.trainer.data import describe_views
    from splat_train.trainer.data.images import Camera, Scene

    cams = [
        Camera(f"{i}.png", tmp_path / f"{i}.png", np.eye(4, dtype=np.float32), np.eye(3, dtype=np.float32), 64, 48)
        for i in range(3)
    ]
    scene = Scene(cams, None, None, 1.0, np.eye(4, dtype=np.float32), "colmap")
    line = describe_views(scene, [1, 2], [0], cache_bytes=2**30)[0]
    assert "decoded as needed into a cache of 1 GiB (--image_cache_gb)" in line


DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "juicebox"


@pytest.mark.skipif(not (DATA / "images_4").is_dir(), reason="../shared/data/juicebox is absent (see its SOURCE.md)")
def test_repeat_capture_makes_a_loadable_larger_capture(tmp_path):
    from splat_train.scripts.repeat_capture import repeat_capture
    from splat_train.trainer.data import load_scene

    assert repeat_capture(DATA, tmp_path / "big", frames=150, data_factor=4) == 150
    big = load_scene(tmp_path / "big", 4)
    small = load_scene(DATA, 4)
    assert len(big.cameras) == 150 and len(big.points) == len(small.points)
    assert (big.cameras[70].width, big.cameras[70].height) == (480, 270)
    assert big.cameras[70].image_path.resolve() == (DATA / "images_4" / small.cameras[70 % 64].name).resolve()
    centres = np.stack([c.camtoworld[:3, 3] for c in big.cameras])
    assert not np.allclose(centres[0], centres[64])  # the same image, a jittered pose
    assert np.linalg.norm(centres[0] - centres[64]) < 0.1 * np.linalg.norm(centres.std(0))


def test_streamed_views_carry_the_masks_as_a_fourth_channel(scene, tmp_path):
    """With loss masks, a streamed batch is the image and its mask (1 keep, 0 leave out) in one
    uint8 tensor, as the preloaded views give it."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from scenes import write_colmap_scene

    from splat_train.trainer.data import load_scene

    keep = np.ones((32, 32), dtype=bool)
    keep[4:20, 8:30] = False
    root = write_colmap_scene(tmp_path / "masked", scene, masks={1: keep, 5: keep})
    colmap = load_scene(root, 1)
    preloaded = TrainViews(Dataset(colmap, list(range(24))), torch.device("cpu"))
    data = Dataset(colmap, list(range(24)), preload=False)
    sampler = CameraSampler(data, 1, seed=0)
    streamed = TrainViews(data, torch.device("cpu"), host_cache_bytes=8 * 32 * 32 * 4, items_at=sampler.batch_at)
    assert preloaded.channels == streamed.channels == 4
    for step in range(30):
        items = sampler.batch_at(step)
        assert torch.equal(streamed.images_of(items, step), preloaded.images_of(items)), step
    masked = preloaded.images_of([1])[0, :, :, 3]
    assert masked.sum() == keep.sum() and preloaded.images_of([2])[0, :, :, 3].min() == 1
    streamed.close()


def _streamed(scene, batch_size=1, cache_images=8, threads=0):
    data = Dataset(scene, list(range(24)), preload=False)
    sampler = CameraSampler(data, batch_size, seed=3)
    views = TrainViews(
        data,
        torch.device("cpu"),
        host_cache_bytes=cache_images * 32 * 32 * 3,
        items_at=sampler.batch_at,
        decode_threads=threads,
    )
    return data, sampler, views


def test_streamed_cache_is_one_buffer_and_decode_threads_make_no_torch_call(scene, monkeypatch):
    """The cache is allocated once (equal slots of the largest image); the decode threads write
    into it with numpy only, so on a GPU they make no CUDA call that a graph capture on the
    training thread would trip over (no pinned allocation, no copy through torch)."""
    import threading

    calls = []
    for name in ("empty", "from_numpy", "zeros", "stack"):
        real = getattr(torch, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append((threading.current_thread().name, _name))
            return _real(*args, **kwargs)

        monkeypatch.setattr(torch, name, spy)
    data, sampler, views = _streamed(scene)
    # 8 images' bytes as power-of-two buffers (the pinned allocator's sizes): 16 KiB (5 slots) + 8 KiB (2)
    assert [a.shape for a in views._arenas] == [(5, 32 * 32 * 3), (2, 32 * 32 * 3)] and views.num_slots == 7
    arena = [a.data_ptr() for a in views._arenas]
    for step in range(60):
        items = sampler.batch_at(step)
        got = views.images_of(items, step)
        assert torch.equal(got[0], torch.from_numpy(scene.images[data.indices[items[0]]])), step
    views.close()
    assert [a.data_ptr() for a in views._arenas] == arena and views.decodes > 24  # reused, never reallocated
    assert not [c for c in calls if c[0].startswith("decode")], calls


def test_a_slot_is_reused_only_after_its_upload_and_never_while_handed_out(scene):
    """A new decode takes the least recently used slot outside the planned window whose last
    upload has completed (its CUDA event), and never the slot of an item being handed out."""

    class Event:
        def __init__(self, done):
            self.done = done

        def query(self):
            return self.done

    data, sampler, views = _streamed(scene, cache_images=4)
    views._free = []
    views._cache.update({0: 0, 1: 1, 2: 2, 3: 3})  # four decoded items, 0 least recently used
    views._window = {3}
    pending = Event(False)
    views._uploads[0] = pending
    views._held = {1}
    with views._lock:
        assert views._take_slot() == 2  # 0 still uploading, 1 handed out, 3 planned
        pending.done = True
        assert views._take_slot() == 0
        assert views._take_slot() is None  # 1 held, 3 planned
    assert list(views._cache) == [1, 3]
    views.close()


@pytest.mark.parametrize("images, batch_size", [(1, 1), (3, 2)])
def test_a_cache_of_fewer_than_two_batches_is_refused_at_the_start(scene, images, batch_size):
    data = Dataset(scene, list(range(24)), preload=False)
    sampler = CameraSampler(data, batch_size, seed=3)
    with pytest.raises(ValueError, match="--image_cache_gb .* less than two batches of"):
        TrainViews(
            data,
            torch.device("cpu"),
            host_cache_bytes=images * 32 * 32 * 3,
            items_at=sampler.batch_at,
            batch_size=batch_size,
        )


def test_the_cache_buffers_stay_within_the_bound_in_power_of_two_sizes(scene):
    """torch's pinned-memory allocator rounds each request up to a power of two, so each buffer is
    one (its slots fill it as far as they fit) and together they stay within --image_cache_gb."""
    data, _, views = _streamed(scene, cache_images=50)
    requested = [a.numel() for a in views._arenas]
    rounded = [1 << (n - 1).bit_length() for n in requested]
    assert sum(rounded) <= 50 * 32 * 32 * 3
    assert all(r - n < views.slot_bytes for n, r in zip(requested, rounded))  # less than a slot lost each
    assert views.num_slots == sum(a.shape[0] for a in views._arenas) >= 40
    views.close()


def test_waiting_for_a_slot_does_not_raise_another_items_decode_error(scene, monkeypatch):
    """With every slot taken, the training thread waits for some other decode to finish; if that
    decode fails, its error belongs to its own item (raised when that item is asked for), not to
    the item being waited for."""
    import threading

    data, sampler, views = _streamed(scene, cache_images=3)  # two slots (a 8 KiB buffer)
    assert views.num_slots == 2
    gate = threading.Event()
    real = views._load_array

    def load(i):
        if i == 2:
            gate.wait(5)
            raise OSError("corrupt file of item 2")
        return real(i)

    monkeypatch.setattr(views, "_load_array", load)
    views._window = {0}  # item 0 is planned: its slot is not for the taking
    with views._lock:
        first = views._submit(0)
    first.result()
    with views._lock:
        assert views._submit(2) is not None and views._take_slot() is None  # both slots taken
    threading.Timer(0.2, gate.set).start()
    got = views._host_image(5)  # waits for item 2's decode to fail, then takes its slot
    assert torch.equal(got, torch.from_numpy(scene.images[data.indices[5]]))
    with pytest.raises(OSError, match="item 2"):
        views._host_image(2)
    views.close()


@pytest.mark.parametrize("batch_size, cache_images", [(1, 12), (5, 24)])
def test_the_plan_asks_the_sampler_only_for_new_steps_and_matches_a_fresh_plan(scene, batch_size, cache_images):
    """_plan keeps its window from step to step: in a run's steady state each step asks the
    sampler for the one step entering the window, and the window (items planned, decodes
    submitted) is the one a plan made from scratch at that step would hold, also over batches of
    different sizes (24 views in batches of 5: a short one each epoch), repeated steps, steps
    back and jumps."""
    data = Dataset(scene, list(range(24)), preload=False)
    sampler = CameraSampler(data, batch_size, seed=3)

    def streamed():
        return TrainViews(
            data, torch.device("cpu"), host_cache_bytes=cache_images * 32 * 32 * 3, items_at=sampler.batch_at
        )

    views = streamed()
    asked = []

    def items_at(step):
        asked.append(step)
        return sampler.batch_at(step)

    views.items_at = items_at

    def fresh_window(step):
        other = streamed()
        other._plan(step)
        other.close()
        return [s for s, _ in other._planned], other._window

    steps = list(range(0, 40)) + [40, 40, 38, 39, 41, 43, 47, 100, 101, 102, 60]
    for k, step in enumerate(steps):
        before = len(asked)
        views._plan(step)
        if 0 < k < 40:
            assert len(asked) - before == 1, (step, asked[before:])  # only the step entering the window
        window, items = fresh_window(step)
        assert [s for s, _ in views._planned] == window and views._window == items, step
        assert views._planned_items == sum(len(b) for _, b in views._planned)
        assert len({len(b) for _, b in views._planned}) <= 2
    if batch_size == 5:
        assert {len(sampler.batch_at(s)) for s in range(40)} == {4, 5}  # the window saw both sizes
    views.close()


def test_a_plan_that_raises_keeps_no_half_made_window(scene):
    """A batch larger than half the cache raises ValueError naming --image_cache_gb; the window
    is then dropped, so a later plan is the one a fresh plan would make (not one cut short by a
    stale count)."""
    data = Dataset(scene, list(range(24)), preload=False)
    items_at = lambda s: list(range(7)) if s == 8 else [s % 24]  # step 8's batch: over half of 11 slots
    make = lambda: TrainViews(data, torch.device("cpu"), host_cache_bytes=12 * 32 * 32 * 3, items_at=items_at)
    views, fresh = make(), make()
    views._plan(0)
    views._plan(1)
    for step in (3, 8):
        with pytest.raises(ValueError, match="--image_cache_gb .* less than two batches of step 8"):
            views._plan(step)
    views._plan(9)
    fresh._plan(9)
    assert list(views._planned) == list(fresh._planned) == [(s, [s]) for s in range(9, 14)]
    assert views._planned_items == 5
    views.close()
    fresh.close()


def test_the_sampler_keeps_the_two_most_recently_used_epochs(scene):
    """A look-ahead window spans an epoch's end: alternating between two epochs draws each once
    (memoized), the epoch dropped for a third is the least recently used, and every batch equals
    what a sampler that never saw the other epochs draws."""
    data = Dataset(scene, list(range(24)), preload=False)
    sampler = CameraSampler(data, 2, seed=5)
    per_epoch = sampler.num_batches_per_epoch
    drawn = []
    real = sampler.epoch_batches.__func__

    def counting(self, epoch):
        if epoch not in self._epochs:
            drawn.append(epoch)
        return real(self, epoch)

    sampler.epoch_batches = counting.__get__(sampler)
    for k in range(3):
        for step in (per_epoch - 1, per_epoch, per_epoch - 2, per_epoch + 1):
            assert sampler.batch_at(step) == CameraSampler(data, 2, seed=5).batch_at(step), (k, step)
    assert drawn == [0, 1]
    sampler.batch_at(2 * per_epoch)  # epoch 2: epoch 0 (used before epoch 1's last use) goes
    assert list(sampler._epochs) == [1, 2]
    sampler.batch_at(per_epoch)  # epoch 1 again, then a third: epoch 2 is now the least recent
    sampler.batch_at(0)
    assert list(sampler._epochs) == [1, 0] and drawn == [0, 1, 2, 0]
    assert sampler.batch_at(3) == CameraSampler(data, 2, seed=5).batch_at(3)
