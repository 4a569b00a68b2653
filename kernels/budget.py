"""ByteSplat's per-tile Gaussian budget (ByteSplat §5): what fits in a GPU's on-chip shared memory,
read from the device at run time. Pruning stage 3 trims tiles towards it (trainer/prune.py) and
the fused path's reports give the fraction of tiles within it. Compile-time introspection of the
kernels (registers, spills) is kernels/resources.py."""

from __future__ import annotations

from .constants import RASTER_RECORD_BYTES, TILE_SIZE

# On chip per resident Gaussian: its record plus its column of the [256, budget] alpha state.
RESIDENT_BYTES_PER_GAUSSIAN = RASTER_RECORD_BYTES + TILE_SIZE * TILE_SIZE * 4
CPU_TILE_BUDGET = 64  # budget on CPU: small, so pruning tests have tiles over it


def tile_budget(device) -> int:
    """ByteSplat's per-tile Gaussian budget on ``device`` (§5): what fits in on-chip shared memory.
    Pruning stage 3 trims tiles towards it and its reports give the fraction of tiles within it.
    The native fused kernel (kernels/csrc) runs tiles of any length: the figure steers pruning only.

    CUDA / ROCm: the per-block shared memory the device offers (``shared_memory_per_block_optin``
    when torch exposes it (ROCm's properties lack it), else ``shared_memory_per_block``, bytes)
    divided by RESIDENT_BYTES_PER_GAUSSIAN (1060 bytes: a 36-byte record + a 256-pixel fp32 alpha
    column), rounded down to a power of two (e.g. 227 KiB -> 128, 64 KiB -> 32); 0 if not even
    one fits. Other devices (CPU, the Triton interpreter): CPU_TILE_BUDGET (64).
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return CPU_TILE_BUDGET
    props = torch.cuda.get_device_properties(dev)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
    n = int(smem) // RESIDENT_BYTES_PER_GAUSSIAN
    return 0 if n < 1 else 1 << (n.bit_length() - 1)
