"""The training views as a training step reads them: uint8 images and cameras already where the
step runs, so that drawing a batch costs no host-to-device copy and no host synchronization.

Images stay uint8 (3 bytes a pixel; the loss kernel reads them as they are, see
kernels/fused_ssim.py ``uint8_to_unit``). When any training view has a loss mask (masks.py), every
image carries it as a fourth channel (1 keep, 0 leave out; 1 everywhere for a view without one),
so a batch's masks travel with its images in one copy:

* on a GPU, on the device when all training images together take at most ``device_share`` of
  the device's memory (and fit what is free): uploaded once, after which no host copy is kept;
* on a GPU otherwise, in pinned host memory, the next step's batch copied ahead on a side stream
  (``non_blocking``; the step's stream waits on an event, never the host);
* on the CPU, the decoded arrays themselves.

Cameras (camera-to-world [V, 4, 4], intrinsics [V, 3, 3], float32) live on the device from the
start. A batch of one view is a slice (a view: no kernel at all); larger batches stack slices.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .sampler import Dataset


class TrainViews:
    """The views of ``dataset`` on ``device`` (see the module docstring).

    ``device_share``: the largest fraction of the GPU's total memory the uint8 images may take
    on the device (0 keeps them in pinned host memory). ``where`` says what was chosen:
    "device", "pinned" or "host" (CPU runs).
    """

    def __init__(self, dataset: Dataset, device: torch.device, device_share: float = 0.25):
        if not 0.0 <= device_share <= 1.0:
            raise ValueError(f"--device_images_share must be in [0, 1], got {device_share}")
        self.dataset, self.device = dataset, device
        cameras = [dataset.scene.cameras[i] for i in dataset.indices]
        self.camtoworlds = torch.from_numpy(np.stack([c.camtoworld for c in cameras]).astype(np.float32)).to(device)
        self.Ks = torch.from_numpy(np.stack([c.K for c in cameras]).astype(np.float32)).to(device)
        self.ids = torch.arange(len(cameras), device=device)  # [V] dataset item ids, for --pose_opt / --app_opt
        masks = [dataset.mask(i) for i in range(len(dataset))]
        self.channels = 4 if any(m is not None for m in masks) else 3  # RGB (+ kept-pixel mask)
        self.num_bytes = sum(c.width * c.height * self.channels for c in cameras)
        self.where = self._placement(device_share)
        host = [torch.from_numpy(np.ascontiguousarray(self._with_mask(dataset.image(i), m)))
                for i, m in enumerate(masks)]
        if self.where == "device":
            self.images = [im.to(device) for im in host]
        elif self.where == "pinned":
            self.images = [im.pin_memory() for im in host]
            self._stream = torch.cuda.Stream(device)
        else:
            self.images = host  # the dataset's own arrays (shared memory)
        if self.where != "host":
            dataset.release_images()  # the copies above are the only ones kept
        self._ahead: Optional[tuple[tuple[int, ...], torch.Tensor, torch.cuda.Event]] = None

    def _with_mask(self, image: np.ndarray, keep: Optional[np.ndarray]) -> np.ndarray:
        """uint8 [H, W, 3] image -> [H, W, self.channels]: the mask (1 keep, 0 leave out) as a
        fourth channel when the views have masks."""
        if self.channels == 3:
            return image
        keep = np.ones(image.shape[:2], dtype=np.uint8) if keep is None else keep.astype(np.uint8)
        return np.concatenate([image, keep[:, :, None]], axis=2)

    def _placement(self, device_share: float) -> str:
        if self.device.type != "cuda":
            return "host"
        free, total = torch.cuda.mem_get_info(self.device)
        if self.num_bytes <= device_share * total and self.num_bytes <= 0.5 * free:
            return "device"
        return "pinned"

    def __len__(self) -> int:
        return len(self.images)

    def _stack(self, source: list | torch.Tensor, items: list[int]) -> torch.Tensor:
        if len(items) == 1:
            return source[items[0]][None]
        return torch.stack([source[i] for i in items])

    def cameras(self, items: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(camtoworlds [B, 4, 4], Ks [B, 3, 3]) of dataset items ``items``, on the device."""
        return self._stack(self.camtoworlds, items), self._stack(self.Ks, items)

    def item_ids(self, items: list[int]) -> torch.Tensor:
        """int64 [B] dataset item ids on the device (no host-to-device copy)."""
        return self._stack(self.ids, items)

    def images_of(self, items: list[int]) -> torch.Tensor:
        """uint8 [B, H, W, channels] of items sharing one image size, on the device (channel 3,
        when there is one, is the mask: 1 keep, 0 leave out); what :meth:`prefetch` copied ahead
        when it was these items."""
        if self.where != "pinned":
            return self._stack(self.images, items)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == tuple(items):
            _, images, ready = ahead
            torch.cuda.current_stream(self.device).wait_event(ready)
            images.record_stream(torch.cuda.current_stream(self.device))
            return images
        return self._copy(items)

    def prefetch(self, items: list[int]) -> None:
        """Start copying ``items``' images to the device on a side stream (pinned images only;
        otherwise nothing to do)."""
        if self.where != "pinned":
            return
        self._stream.wait_stream(torch.cuda.current_stream(self.device))  # the buffer's memory is free
        with torch.cuda.stream(self._stream):
            images = self._copy(items)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        self._ahead = (tuple(items), images, ready)

    def _copy(self, items: list[int]) -> torch.Tensor:
        h, w, c = self.images[items[0]].shape
        out = torch.empty((len(items), h, w, c), dtype=torch.uint8, device=self.device)
        for j, i in enumerate(items):
            out[j].copy_(self.images[i], non_blocking=True)
        return out
