# The geometry's Adam in the projection's backward (--fused_adam geometry, 086e745, reverted in the
# next commit): the backward stepped means, quats, scales and opacities in place and wrote only the
# SH gradients for the separate launch. Two device calls at 086e745, from the repository root after
# `source .whl/gpu-prelude.sh`:
# - h100/ (one H100; an nvidia-h200 call that got an H100): bench_projection --optimizer at 20 M
#   (optimizer-20m.{json,log}: the backward + Adam forms, CUDA events, median of 10 after 3), the
#   show script at 20 M and 2 M with a variant (timeline.txt; its bench folders did not come back:
#   the device returns folders only a few levels deep), the GPU tests of the Adam in the backward
#   (gpu_tests.log: the two geometry cases failed on a bit-for-bit comparison of the shN gradient).
# - h200/ (one H200): the 20 M bench with both Adam-in-the-backward steps beside the default
#   (bench-20m/: bench.json with phases, profile and bytes model; bench.md; console.log), then the
#   GPU kernel tests with the shN gradient compared to 1e-6 (relative norm) instead (gpu_tests.log).
V="--steps 12 --warmup 4 --phase_steps 3 --profile_steps 3 --world_sizes 1"
GEO="ours-dense-fused-geometry-adam=--raster fused --fused_adam geometry"
# h100/
python3 -m splat_train.scripts.bench_projection --optimizer --gaussians 20000000 --repeats 10 --warmup 3 \
  --json optimizer-20m.json > optimizer-20m.log
R=h100 SCENES="20m 2m" EXTRA="--variant \"$GEO\"" bash docs/bench/large-scenes/show/run.sh
python3 -m pytest -q -s -m gpu tests/test_projection_kernel.py tests/test_gpu.py -k "adam_in_the" > gpu_tests.log
# h200/
splat-train bench --synthetic_gaussians 20000000 --resolution 1920x1080 --variants gsplat-dist ours-dense-fused \
  --variant "ours-dense-fused-adam-on=--raster fused --fused_adam on" --variant "$GEO" $V --out bench-20m
python3 -m pytest -q -s -m gpu tests/test_projection_kernel.py -k "matches_the_adam_kernel" > gpu_tests.log
