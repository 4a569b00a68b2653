#!/usr/bin/env bash
# The exchange's bytes per step and rank at W = 2 over gloo, against the loopback rows at W = 1
# (zero bytes: no other rank). Machine: a shared 2-core CPU host (its ms/iter measure nothing but
# that host's load; the bytes are exact). Commit: the --loopback branch, before merge.
splat-train bench --device cpu --world_sizes 1 2 --synthetic_gaussians 2000 --resolution 64x48 \
  --num_cameras 8 --steps 6 --warmup 2 --phase_steps 1 \
  --variants ours-dense ours-packed ours-dense-loopback ours-packed-loopback ours-packed-sparse \
  ours-packed-sparse-loopback --out R/exchange-bytes-w2
