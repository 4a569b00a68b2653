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
  pure function of the step) into a cache of at most ``host_cache_bytes`` (pinned on a GPU),
  least recently used first out; on a GPU the next batch is copied ahead on a side stream;
* "pinned": on a GPU otherwise, every image in pinned host memory, the next batch copied ahead;
* "host": on the CPU, the decoded arrays themselves.

Cameras (camera-to-world [V, 4, 4], intrinsics [V, 3, 3], float32) live on the device from the
start. A batch of one view is a slice (a view: no kernel at all); larger batches stack slices.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Optional

import numpy as np
import torch

from .masks import has_masks
from .sampler import Dataset

DECODE_THREADS = min(8, os.cpu_count() or 1)


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
    decodes ahead. Raises ValueError for a share outside [0, 1] or a cache smaller than the
    largest batch it must hold.
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
            self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()
            self._pending: dict[int, Future] = {}
            self._lock = threading.Lock()
            self._pool = ThreadPoolExecutor(max_workers=self.decode_threads, thread_name_prefix="decode")
            self.peak_cache_bytes = 0
            self.decodes, self.waits, self.wait_seconds = 0, 0, 0.0  # decodes made; times a step waited for one
            self._planned_until = -1
        if self.where != "host" or self.channels == 4:
            dataset.release_images()  # the copies above (or the stream's) are the only ones kept

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
        image, keep = self.dataset.view(i)
        if self.channels == 4:
            keep = np.ones(image.shape[:2], dtype=np.uint8) if keep is None else keep.astype(np.uint8)
            image = np.concatenate([image, keep[:, :, None]], axis=2)
        return torch.from_numpy(np.ascontiguousarray(image))

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
        host = [self._host_image(i) for i in items]  # streaming: waits for their decode
        self._stream.wait_stream(torch.cuda.current_stream(self.device))  # the buffer's memory is free
        with torch.cuda.stream(self._stream):
            images = self._upload(host)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        self._ahead = (tuple(items), images, ready)

    def _copy(self, items: list[int]) -> torch.Tensor:
        host = [self._host_image(i) for i in items]
        if self.device.type != "cuda":
            return host[0][None] if len(host) == 1 else torch.stack(host)
        return self._upload(host)

    def _upload(self, host: list[torch.Tensor]) -> torch.Tensor:
        h, w, c = host[0].shape
        out = torch.empty((len(host), h, w, c), dtype=torch.uint8, device=self.device)
        for j, image in enumerate(host):
            out[j].copy_(image, non_blocking=True)
        return out

    # ------------------------------------------------------------------ streaming
    def _host_image(self, i: int) -> torch.Tensor:
        if self.where == "pinned":
            return self.images[i]
        with self._lock:
            if i in self._cache:
                self._cache.move_to_end(i)
                return self._cache[i]
            future = self._pending.get(i) or self._submit(i)
        if not future.done():  # the training thread waits for a decode: the cache or lookahead is too small
            t0 = time.perf_counter()
            future.result()
            self.waits += 1
            self.wait_seconds += time.perf_counter() - t0
        return future.result()

    def _submit(self, i: int) -> Future:
        """Decode item ``i`` on a pool thread into the cache (the caller holds the lock)."""

        def decode():
            image = self._load(i)
            if self.device.type == "cuda":  # copied by numpy: a torch copy on this thread would start
                pinned = torch.empty(image.shape, dtype=image.dtype, pin_memory=True)  # its own OpenMP team
                pinned.numpy()[...] = image.numpy()
                image = pinned
            with self._lock:
                self.decodes += 1
                self._pending.pop(i, None)
                self._cache[i] = image
                self._evict(keep=i)
            return image

        future = self._pool.submit(decode)
        self._pending[i] = future
        return future

    def _evict(self, keep: int) -> None:
        """Drop least recently used images until the cache fits its bound (never ``keep``, the
        one just decoded, nor the images planned for the next steps)."""
        used = sum(self.sizes[i] for i in self._cache)
        planned = self._window_items()
        for i in list(self._cache):
            if used <= self.cache_bytes:
                break
            if i == keep or i in planned:
                continue
            used -= self.sizes[i]
            del self._cache[i]
        self.peak_cache_bytes = max(self.peak_cache_bytes, used)

    def _window_items(self) -> set[int]:
        return getattr(self, "_window", set())

    def _plan(self, step: int) -> None:
        """Decode ahead the items of steps step .. step + k, k the most steps whose images fit
        half of the cache (at most ``lookahead``)."""
        window: list[list[int]] = []
        total = 0
        for s in range(step, step + self.lookahead + 1):
            items = self.items_at(s)  # type: ignore[misc]  # streaming views always have items_at (__init__)
            size = sum(self.sizes[i] for i in items)
            if not window and 2 * size > self.cache_bytes:
                raise ValueError(
                    f"--image_cache_gb {self.cache_bytes / 2**30:g} holds less than two batches of "
                    f"step {s} ({size / 2**20:,.1f} MB each); raise it"
                )
            if window and total + size > self.cache_bytes // 2:
                break
            window.append(items)
            total += size
        with self._lock:
            self._window = {i for items in window for i in items}
            for items in window:
                for i in items:
                    if i not in self._cache and i not in self._pending:
                        self._submit(i)

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
