"""The training views as a training step reads them: uint8 images and cameras already where the
step runs, so that drawing a batch costs no host-to-device copy and no host synchronization.

Images stay uint8 (3 bytes a pixel; the loss kernel reads them as they are, see
kernels/fused_ssim.py ``uint8_to_unit``). When any training view has a loss mask (masks.py), every
image carries it as a fourth channel (1 keep, 0 leave out; 1 everywhere for a view without one),
so a batch's masks travel with its images in one copy. Where they live (``TrainViews.where``):

* "device": on a GPU, when all training images together take at most ``device_share`` of its
  memory (and half of what is free): decoded on a few threads and uploaded once; no host copy
  is kept, so host memory stays bounded whatever the dataset's size;
* "stream": when ``host_cache_bytes`` > 0 and they do not go to the device (a dataset beyond
  memory): decoded on background threads ``lookahead`` steps ahead of their use (the sampler is a
  pure function of the step) into a cache of at most ``host_cache_bytes``, least recently used
  first out; on a GPU the next batch is copied ahead on a side stream. The cache is a few buffers
  (pinned on a GPU) of equal slots, each the size of the largest image, allocated once: the decode
  threads write into a slot with numpy and make no CUDA call, so the step's CUDA graphs can be
  captured while they run, and no pinned memory is allocated after the start. The training thread
  gives a slot to a new decode only once the last upload from it has completed;
* "pinned": on a GPU otherwise, every image in pinned host memory, the next batch copied ahead;
* "host": on the CPU, the decoded arrays themselves.

Cameras (camera-to-world [V, 4, 4], intrinsics [V, 3, 3], float32) live on the device from the
start. A batch of one view is a slice (a view: no kernel at all); larger batches stack slices.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Callable, Optional

import numpy as np
import torch

from .masks import has_masks
from .sampler import Dataset

DECODE_THREADS = min(8, os.cpu_count() or 1)


def readable_size(num_bytes: int) -> str:
    """``num_bytes`` in the largest binary unit that keeps it >= 1 (three significant digits)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.3g} {unit}"
    return f"{num_bytes} bytes"


def rows_of(source: list | torch.Tensor, items: list[int]) -> torch.Tensor:
    """``source[items]`` stacked, [B, ...]: one item is a view of its row (no kernel, no copy);
    several are one stack. ``source``: a tensor or a list of equally shaped tensors."""
    if len(items) == 1:
        return source[items[0]][None]
    return torch.stack([source[i] for i in items])


class TrainViews:
    """The views of ``dataset`` on ``device`` (see the module docstring).

    ``device_share``: the largest fraction of the GPU's total memory the uint8 images may take
    on the device (0 keeps them on the host). ``host_cache_bytes``: 0 keeps every decoded image
    on the host when they stay there; > 0 bounds them to that many bytes (streaming).
    ``items_at(step)``: the dataset items step ``step`` trains on (the sampler), which streaming
    decodes ahead; ``batch_size``: the most items a step trains on. Raises ValueError for a share
    outside [0, 1] or a cache that holds fewer than two batches.
    """

    def __init__(
        self,
        dataset: Dataset,
        device: torch.device,
        device_share: float = 0.25,
        host_cache_bytes: int = 0,
        items_at: Optional[Callable[[int], list[int]]] = None,
        lookahead: int = 16,
        decode_threads: int = 0,
        batch_size: int = 1,
    ):
        if not 0.0 <= device_share <= 1.0:
            raise ValueError(f"--device_images_share must be in [0, 1], got {device_share}")
        self.dataset, self.device = dataset, device
        if decode_threads < 0:
            raise ValueError(f"--decode_threads must be >= 0, got {decode_threads}")
        self.decode_threads = decode_threads or DECODE_THREADS
        cameras = [dataset.scene.cameras[i] for i in dataset.indices]
        self.camtoworlds = torch.from_numpy(np.stack([c.camtoworld for c in cameras]).astype(np.float32)).to(device)
        self.Ks = torch.from_numpy(np.stack([c.K for c in cameras]).astype(np.float32)).to(device)
        self.ids = torch.arange(len(cameras), device=device)  # [V] dataset item ids, for --pose_opt / --app_opt
        self.channels = 4 if has_masks(dataset.scene, dataset.alpha_as_mask) else 3  # RGB (+ kept-pixel mask)
        self.sizes = [c.width * c.height * self.channels for c in cameras]
        self.num_bytes = sum(self.sizes)
        self.cache_bytes = int(host_cache_bytes)
        self.where = self._placement(device_share)
        if self.where == "stream" and items_at is None:
            raise ValueError("streaming views need the sampler (items_at)")
        self.items_at, self.lookahead = items_at, lookahead
        self._ahead: Optional[tuple[tuple[int, ...], torch.Tensor, torch.cuda.Event]] = None
        if self.device.type == "cuda" and self.where != "device":
            self._stream = torch.cuda.Stream(device)
        if self.where == "device":
            self.images = self._decoded(lambda im: im.to(device))
        elif self.where == "pinned":
            self.images = self._decoded(lambda im: im.pin_memory())
        elif self.where == "host":
            self.images = self._decoded(lambda im: im)  # the dataset's own arrays (shared memory) for RGB
        else:
            self.slot_bytes = max(self.sizes)
            self._arenas = self._allocate_slots()
            self._slot_at = [(a, row) for a, arena in enumerate(self._arenas) for row in range(arena.shape[0])]
            self.num_slots = len(self._slot_at)
            if self.num_slots < 2 * batch_size:
                raise ValueError(
                    f"--image_cache_gb ({readable_size(self.cache_bytes)}) holds {self.num_slots} images of "
                    f"{readable_size(self.slot_bytes)}, less than two batches of {batch_size}; raise it"
                )
            self._arenas_np = [arena.numpy() for arena in self._arenas]  # the decode threads write through these
            self._cache: OrderedDict[int, int] = OrderedDict()  # decoded item -> slot, least recent first
            self._pending: dict[int, tuple[int, Future]] = {}  # item being decoded -> (slot, its decode)
            self._free = list(range(self.num_slots))
            self._uploads: dict[int, torch.cuda.Event] = {}  # slot -> the event after its last upload
            self._held: set[int] = set()  # items whose slots are being handed out for an upload
            self._used_bytes = 0  # the images cached or being decoded
            self._lock = threading.Lock()
            self._pool = ThreadPoolExecutor(max_workers=self.decode_threads, thread_name_prefix="decode")
            self.peak_cache_bytes = 0
            self.decodes, self.waits, self.wait_seconds = 0, 0, 0.0  # decodes made; times a step waited for one
            self._planned: deque = deque()  # the planned window: (step, items), in step order (_plan)
            self._planned_items = 0  # how many items it holds
            self._next_items: tuple[int, list[int]] = (-1, [])  # the step after the window, and its items
        if self.where != "host" or self.channels == 4:
            dataset.release_images()  # the copies above (or the stream's) are the only ones kept

    def _allocate_slots(self) -> list[torch.Tensor]:
        """The streaming cache's buffers, uint8 [slots, slot_bytes] each, at most ``cache_bytes``
        together. On a GPU they are pinned, and torch's pinned-memory allocator rounds every
        request up to a power of two: so each buffer is a power of two in size (the largest that
        fits what is left of the bound) holding as many slots as fit in it."""
        arenas, left = [], self.cache_bytes
        while left >= self.slot_bytes:
            chunk = 1 << (left.bit_length() - 1)  # the largest power of two <= left
            slots = chunk // self.slot_bytes
            if slots == 0:
                break
            pin = self.device.type == "cuda"
            arenas.append(torch.empty((slots, self.slot_bytes), dtype=torch.uint8, pin_memory=pin))
            left -= chunk
        return arenas

    def _placement(self, device_share: float) -> str:
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            if self.num_bytes <= device_share * total and self.num_bytes <= 0.5 * free:
                return "device"
        if self.cache_bytes > 0:
            return "stream"
        return "pinned" if self.device.type == "cuda" else "host"

    def _load(self, i: int) -> torch.Tensor:
        """uint8 [H, W, channels] of item ``i``: its image and, with masks, its mask as a fourth
        channel (1 keep, 0 leave out)."""
        return torch.from_numpy(self._load_array(i))

    def _load_array(self, i: int) -> np.ndarray:
        """:meth:`_load` as a numpy array (what the decode threads use: no torch call)."""
        image, keep = self.dataset.view(i)
        if self.channels == 4:
            keep = np.ones(image.shape[:2], dtype=np.uint8) if keep is None else keep.astype(np.uint8)
            image = np.concatenate([image, keep[:, :, None]], axis=2)
        return np.ascontiguousarray(image)

    def _decoded(self, place: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        """Every image, decoded on ``decode_threads`` threads and ``place``d one at a time (only the
        images in flight are held on the host besides what ``place`` keeps)."""

        def one(i):
            return place(self._load(i))

        with ThreadPoolExecutor(max_workers=self.decode_threads) as pool:
            return list(pool.map(one, range(len(self.dataset))))

    def __len__(self) -> int:
        return len(self.sizes)

    def cameras(self, items: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(camtoworlds [B, 4, 4], Ks [B, 3, 3]) of dataset items ``items``, on the device."""
        return rows_of(self.camtoworlds, items), rows_of(self.Ks, items)

    def item_ids(self, items: list[int]) -> torch.Tensor:
        """int64 [B] dataset item ids on the device (no host-to-device copy)."""
        return rows_of(self.ids, items)

    def images_of(self, items: list[int], step: Optional[int] = None) -> torch.Tensor:
        """uint8 [B, H, W, channels] of items sharing one image size, on the device (channel 3,
        when there is one, is the mask: 1 keep, 0 leave out); what :meth:`prefetch` copied ahead
        when it was these items. ``step`` (streaming): the step they are for, from which the next
        ``lookahead`` steps' images are decoded ahead."""
        if self.where in ("device", "host"):
            return rows_of(self.images, items)
        if self.where == "stream" and step is not None:
            self._plan(step)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == tuple(items):
            _, images, ready = ahead
            torch.cuda.current_stream(self.device).wait_event(ready)
            images.record_stream(torch.cuda.current_stream(self.device))
            return images
        return self._copy(items)

    def prefetch(self, items: list[int]) -> None:
        """Start copying ``items``' images to the device on a side stream (pinned and streamed
        images on a GPU; otherwise nothing to do)."""
        if self.where in ("device", "host") or self.device.type != "cuda":
            return
        self._held = set(items)
        try:
            host = [self._host_image(i) for i in items]  # streaming: waits for their decode
            self._stream.wait_stream(torch.cuda.current_stream(self.device))  # the buffer's memory is free
            with torch.cuda.stream(self._stream):
                images = self._upload(host)
                ready = torch.cuda.Event()
                ready.record(self._stream)
            self._uploaded(items, ready)
        finally:
            self._held = set()
        self._ahead = (tuple(items), images, ready)

    def _copy(self, items: list[int]) -> torch.Tensor:
        self._held = set(items)
        try:
            host = [self._host_image(i) for i in items]
            if self.device.type != "cuda":  # a copy: a streamed image's slot is reused later
                return host[0][None].clone() if len(host) == 1 else torch.stack(host)
            images = self._upload(host)
            if self.where == "stream":
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(self.device))
                self._uploaded(items, done)
            return images
        finally:
            self._held = set()

    def _upload(self, host: list[torch.Tensor]) -> torch.Tensor:
        h, w, c = host[0].shape
        out = torch.empty((len(host), h, w, c), dtype=torch.uint8, device=self.device)
        for j, image in enumerate(host):
            out[j].copy_(image, non_blocking=True)
        return out

    # ------------------------------------------------------------------ streaming
    def _host_image(self, i: int) -> torch.Tensor:
        """uint8 [H, W, channels] of item ``i`` in host memory: pinned, or (streaming) a view of
        its cache slot, decoded now if it is neither cached nor on its way (the step waits). The
        slot stays out of reach of new decodes while ``i`` is in ``_held``."""
        if self.where == "pinned":
            return self.images[i]
        t0: Optional[float] = None
        while True:
            blocker: Optional[Callable[[], object]] = None
            with self._lock:
                if i in self._cache:
                    self._cache.move_to_end(i)
                    view = self._slot_view(i, self._cache[i])
                    break
                entry = self._pending.get(i)
                future = entry[1] if entry is not None else self._submit(i)
                if future is not None:
                    blocker = future.result  # re-raises a decode's error
                else:  # every slot taken: wait for an upload from an evictable one, or any decode
                    uploads = [self._uploads[slot] for slot in self._evictable_slots() if slot in self._uploads]
                    if uploads:
                        blocker = uploads[0].synchronize
                    elif self._pending:  # without its result: another item's failed decode is not ours
                        other = next(iter(self._pending.values()))[1]
                        blocker = partial(wait, [other])
            if blocker is None:
                raise RuntimeError("image cache: no slot can be freed for a decode")  # _plan's check prevents it
            t0 = time.perf_counter() if t0 is None else t0
            blocker()
        if t0 is not None:
            self.waits += 1
            self.wait_seconds += time.perf_counter() - t0
        return view

    def _slot_view(self, i: int, slot: int) -> torch.Tensor:
        h, w = self._shape(i)
        arena, row = self._slot_at[slot]
        return self._arenas[arena][row, : self.sizes[i]].view(h, w, self.channels)

    def _shape(self, i: int) -> tuple[int, int]:
        camera = self.dataset.scene.cameras[self.dataset.indices[i]]
        return camera.height, camera.width

    def _uploaded(self, items: list[int], event: torch.cuda.Event) -> None:
        """Streaming: the upload of ``items`` from their slots completes with ``event``."""
        if self.where != "stream":
            return
        with self._lock:
            for i in items:
                if i in self._cache:
                    self._uploads[self._cache[i]] = event

    def _evictable(self) -> list[tuple[int, int]]:
        """(item, slot) of the cached items outside the planned window and not being handed out,
        least recently used first (the caller holds the lock)."""
        keep = self._window_items() | self._held
        return [(i, slot) for i, slot in self._cache.items() if i not in keep]

    def _evictable_slots(self) -> list[int]:
        return [slot for _, slot in self._evictable()]

    def _take_slot(self) -> Optional[int]:
        """A slot for a new decode: a free one, else that of the least recently used evictable
        item whose last upload has completed; None when there is none (the caller holds the
        lock)."""
        if self._free:
            return self._free.pop()
        for i, slot in self._evictable():
            event = self._uploads.get(slot)
            if event is None or event.query():
                del self._cache[i]
                self._uploads.pop(slot, None)
                self._used_bytes -= self.sizes[i]
                return slot
        return None

    def _submit(self, i: int) -> Optional[Future]:
        """Decode item ``i`` on a pool thread into a slot; None when no slot can be had now (the
        caller holds the lock)."""
        slot = self._take_slot()
        if slot is None:
            return None

        def decode():
            try:
                image = self._load_array(i)
                arena, row = self._slot_at[slot]
                self._arenas_np[arena][row, : image.size] = image.reshape(-1)  # numpy: no CUDA call here
            except BaseException:
                with self._lock:
                    self._pending.pop(i, None)
                    self._free.append(slot)
                    self._used_bytes -= self.sizes[i]
                raise
            with self._lock:
                self.decodes += 1
                self._pending.pop(i, None)
                self._cache[i] = slot

        future = self._pool.submit(decode)
        self._pending[i] = (slot, future)
        self._used_bytes += self.sizes[i]
        self.peak_cache_bytes = max(self.peak_cache_bytes, self._used_bytes)
        return future

    def _window_items(self) -> set[int]:
        return getattr(self, "_window", set())

    def _plan(self, step: int) -> None:
        """Decode ahead the items of steps step .. step + k, k the most steps whose images fill at
        most half of the cache's slots (at most ``lookahead``).

        The window is kept from the previous call: a step asks the sampler only for the steps that
        enter it (one, in a run's steady state), not for all of them again."""
        try:
            self._extend_window(step)
        except BaseException:
            self._planned, self._planned_items = deque(), 0  # a half-made window is not kept
            raise
        with self._lock:
            self._window = {i for _, items in self._planned for i in items}
            for _, items in self._planned:
                for i in items:
                    if i not in self._cache and i not in self._pending and self._submit(i) is None:
                        return  # no slot now: the next step's plan asks again

    def _extend_window(self, step: int) -> None:
        """Move the planned window (``_planned``) to start at ``step`` and fill it (see _plan).
        Raises ValueError when a step's batch is larger than half the cache."""
        window, total = self._planned, self._planned_items  # (step, items) in step order; their items
        if window and not window[0][0] <= step <= window[-1][0] + 1:
            window, total = deque(), 0  # not the next step (a resumed or restarted run): plan afresh
        while window and window[0][0] < step:
            total -= len(window.popleft()[1])
        s = window[-1][0] + 1 if window else step
        while s <= step + self.lookahead:
            if self._next_items[0] != s:  # the step that ended the last window is asked once
                self._next_items = (s, self.items_at(s))  # type: ignore[misc]  # streaming views have items_at
            items = self._next_items[1]
            if 2 * len(items) > self.num_slots:  # a batch larger than the batch_size given
                size = sum(self.sizes[i] for i in items)
                raise ValueError(
                    f"--image_cache_gb ({readable_size(self.cache_bytes)}) holds less than two batches of "
                    f"step {s} ({readable_size(size)} each, {self.num_slots} slots of "
                    f"{readable_size(self.slot_bytes)}); raise it"
                )
            if window and total + len(items) > self.num_slots // 2:
                break
            window.append((s, items))
            total += len(items)
            s += 1
        self._planned, self._planned_items = window, total

    def stream_summary(self) -> Optional[str]:
        """One line on the streamed images (None for the other placements): decodes, the cache's
        peak, and how often and how long the training thread waited for a decode."""
        if self.where != "stream":
            return None
        return (
            f"image cache: {self.decodes:,} decodes, peak {self.peak_cache_bytes / 2**20:,.1f} of "
            f"{self.cache_bytes / 2**20:,.1f} MB; the training thread waited for a decode {self.waits:,} times "
            f"({self.wait_seconds:.2f} s)"
        )

    def close(self) -> None:
        """Stop the decoding threads (streaming)."""
        if self.where == "stream":
            self._pool.shutdown(wait=True, cancel_futures=True)
