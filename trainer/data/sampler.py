"""Train/test split, the image Dataset, and the per-rank camera sampler."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .images import DataError, Scene
from .masks import load_view


def split_indices(num_cameras: int, test_every: int) -> tuple[list[int], list[int]]:
    """(train, test) indices into the name-sorted cameras; test = i % test_every == 0 (gsplat).

    test_every = 0 means no test views (every camera trains). Raises DataError (naming
    test_every) when it is negative, or when the rule would leave no training view (test_every
    of 1, or fewer cameras than it takes to get one past index 0).
    """
    if test_every < 0:
        raise DataError(f"test_every={test_every} must be >= 0 (0 = no test views)")
    if test_every == 0:
        return list(range(num_cameras)), []
    test = [i for i in range(num_cameras) if i % test_every == 0]
    train = [i for i in range(num_cameras) if i % test_every != 0]
    if num_cameras > 0 and not train:
        raise DataError(
            f"test_every={test_every} makes all {num_cameras} cameras test views; "
            "use test_every=0 for no test views, or a larger value"
        )
    return train, test


class Dataset:
    """Training (or test) views of a scene: `indices` are indices into scene.cameras.

    Images are kept as uint8 and turned into float32 [0, 1] tensors per item, with their loss
    masks (bool [H, W], masks.py; None for a view without one). With preload, every image is read
    (in a few threads) in the constructor, so a bad file raises DataError at start-up rather than
    mid-training; ``preload`` may also name the items to read (a rank's share of the test views),
    the others being decoded when asked for. ``alpha_as_mask``: an image's alpha channel is its
    mask (--alpha_as_mask).
    """

    def __init__(
        self, scene: Scene, indices: list[int], preload: "bool | Sequence[int]" = True, alpha_as_mask: bool = True
    ):
        self.scene = scene
        self.indices = [int(i) for i in indices]
        self.alpha_as_mask = alpha_as_mask
        assert all(0 <= i < len(scene.cameras) for i in self.indices), "camera index out of range"
        self._images: Any = None  # preloaded [H, W, 3] uint8 per item (None: decoded when read)
        self._masks: Any = None
        items = range(len(self.indices)) if preload is True else sorted(set(preload or ()))
        if items:
            with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
                views = dict(zip(items, pool.map(lambda i: load_view(scene, self.indices[i], alpha_as_mask), items)))
            self._images = [views[i][0] if i in views else None for i in range(len(self.indices))]
            self._masks = [views[i][1] if i in views else None for i in range(len(self.indices))]

    def __len__(self) -> int:
        return len(self.indices)

    def size(self, i: int) -> tuple[int, int]:
        """(width, height) in pixels of item i."""
        camera = self.scene.cameras[self.indices[i]]
        return camera.width, camera.height

    def release_images(self) -> None:
        """Drop the preloaded images and masks (a copy lives elsewhere, e.g. on the GPU);
        :meth:`image` and :meth:`mask` then decode from the files again."""
        self._images = self._masks = None

    def camera(self, i: int) -> dict:
        """Item i without its image: K [3, 3], camtoworld [4, 4] (float32 tensors), image_id,
        width, height."""
        camera = self.scene.cameras[self.indices[i]]
        return {
            "K": torch.from_numpy(camera.K).float(),  # [3, 3]
            "camtoworld": torch.from_numpy(camera.camtoworld).float(),  # [4, 4]
            "image_id": self.indices[i],
            "width": camera.width,
            "height": camera.height,
        }

    def image(self, i: int) -> np.ndarray:
        """uint8 [H, W, 3] RGB of item i."""
        if self._images is not None and self._images[i] is not None:
            return self._images[i]
        return load_view(self.scene, self.indices[i], self.alpha_as_mask)[0]

    def view(self, i: int) -> "tuple[np.ndarray, np.ndarray | None]":
        """(image, mask) of item i, as :meth:`image` and :meth:`mask`, decoded once."""
        if self._images is not None and self._images[i] is not None:
            return self._images[i], self._masks[i]
        return load_view(self.scene, self.indices[i], self.alpha_as_mask)

    def mask(self, i: int) -> "np.ndarray | None":
        """bool [H, W] kept pixels of item i, or None when every pixel is kept."""
        if self._images is not None and self._images[i] is not None:
            return self._masks[i]
        return load_view(self.scene, self.indices[i], self.alpha_as_mask)[1]

    def __getitem__(self, i: int) -> dict:
        """camera(i) with image float32 [H, W, 3] in [0, 1] and mask bool [H, W] (only when the
        view has one)."""
        image, mask = self.view(i)  # decoded once
        item = dict(self.camera(i), image=torch.from_numpy(image).float() / 255.0)  # [H, W, 3]
        if mask is not None:
            item["mask"] = torch.from_numpy(mask)
        return item

    def batch(self, items: list[int], images: bool = True) -> dict:
        """Stack items (indices into this dataset) that share one image size.

        -> image [B, H, W, 3] float32 (left out when ``images`` is False), K [B, 3, 3],
        camtoworld [B, 4, 4], image_id int64 [B], width, height ints.
        """
        samples = [self[i] if images else self.camera(i) for i in items]
        assert samples, "empty batch"
        width, height = samples[0]["width"], samples[0]["height"]
        assert all((s["width"], s["height"]) == (width, height) for s in samples), "mixed image sizes"
        out = {
            "K": torch.stack([s["K"] for s in samples]),
            "camtoworld": torch.stack([s["camtoworld"] for s in samples]),
            "image_id": torch.tensor([s["image_id"] for s in samples], dtype=torch.int64),
            "width": width,
            "height": height,
        }
        if images:
            out["image"] = torch.stack([s["image"] for s in samples])
        return out


class CameraSampler:
    """Which dataset items each step trains on: a pure function of (seed, rank, step).

    Items are grouped by image size (batches never mix sizes). Epoch e draws from
    numpy.random.default_rng([seed, rank, e]): each size group is shuffled and cut into batches of
    batch_size (a group's last batch may be smaller), then all batches are shuffled together.
    Every epoch has the same number of batches, so step -> (epoch, position) needs no history and
    a resumed run draws exactly what an uninterrupted one draws.
    """

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, rank: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if len(dataset) == 0:
            raise ValueError("CameraSampler needs a non-empty dataset")
        groups: dict[tuple[int, int], list[int]] = {}
        for i in range(len(dataset)):
            groups.setdefault(dataset.size(i), []).append(i)
        self.groups = [np.array(groups[size]) for size in sorted(groups)]  # deterministic order
        self.batch_size = int(batch_size)
        self.seed = int(seed) % 2**64  # SeedSequence wants non-negative entropy
        self.rank = int(rank)
        self.num_batches_per_epoch = sum(-(-len(g) // self.batch_size) for g in self.groups)
        self._epochs: OrderedDict[int, list] = OrderedDict()  # the two most recently used epochs' batches

    @property
    def uniform_batches(self) -> bool:
        """True when every batch has batch_size items of one image size, on every rank (the group
        sizes do not depend on the rank): one size group whose length batch_size divides."""
        return len(self.groups) == 1 and len(self.groups[0]) % self.batch_size == 0

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All batches of one epoch, in draw order."""
        if epoch in self._epochs:  # two are kept: a look-ahead window often spans an epoch's end
            self._epochs.move_to_end(epoch)
            return self._epochs[epoch]
        rng = np.random.default_rng([self.seed, self.rank, epoch])
        batches = []
        for group in self.groups:
            order = rng.permutation(group)
            batches += [order[s : s + self.batch_size].tolist() for s in range(0, len(order), self.batch_size)]
        batches = [batches[j] for j in rng.permutation(len(batches))]
        if len(self._epochs) >= 2:
            self._epochs.popitem(last=False)  # the least recently used
        self._epochs[epoch] = batches
        return batches

    def batch_at(self, step: int) -> list[int]:
        """Indices into the dataset for training step `step` (>= 0)."""
        if step < 0:
            raise ValueError(f"step={step} must be >= 0")
        epoch, position = divmod(int(step), self.num_batches_per_epoch)
        return self.epoch_batches(epoch)[position]


def patch_window(
    seed: int, step: int, rank: int, position: int, width: int, height: int, patch_size: int
) -> tuple[int, int, int, int]:
    """``--patch_size``: the crop (x0, y0, w, h) in pixels of the ``position``-th image of rank
    ``rank``'s batch at ``step``: a patch_size square (smaller where the image is), at an offset
    uniform over the positions that keep it inside the image (gsplat's Dataset draws it likewise
    per item). A pure function of its arguments, so every rank knows every other rank's crops."""
    w, h = min(patch_size, width), min(patch_size, height)
    rng = np.random.default_rng([seed % 2**63, step, rank, position])
    return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
