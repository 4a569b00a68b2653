# The fused kernel writing into the whole-step replay's gradient buffers (b6d83f4, "new") beside
# the tree before it (e43322f, "base": the kernel's own buffer, then four copies), one H200, one
# device call, the two trees imported from two roots and run alternately (timeline.txt). The GPU
# tests of the fused kernel and the graphed steps ran first (gpu_tests.log). Each folder: one
# bench invocation (bench.json with the profile summary, bench.md, console.log).
python -m pytest -q -s -m gpu tests/test_gpu_fused_raster.py tests/test_gpu.py -k "grads_out or graph or whole or fused"
V="--steps 12 --warmup 4 --phase_steps 3 --profile_steps 3 --world_sizes 1"
for r in 1 2; do
  for tree in base new; do  # PYTHONPATH at that tree
    splat-train bench --synthetic_gaussians 20000000 --resolution 1920x1080 --variants gsplat-dist ours-dense-fused $V --out 20m-$tree-$r
  done
done
for tree in base new; do
  splat-train bench --synthetic_layout city --synthetic_gaussians 20000000 --resolution 1920x1080 --variants gsplat-dist ours-dense-fused $V --out city-20m-$tree
done
V60="--steps 8 --warmup 3 --phase_steps 2 --profile_steps 2 --world_sizes 1 --num_cameras 4"
for tree in base new; do
  splat-train bench --synthetic_gaussians 60000000 --resolution 1920x1080 --variants ours-dense-fused $V60 --out 60m-$tree
done
