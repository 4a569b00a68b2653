# The SH coefficients' Adam in a second kernel after the projection's backward (--fused_adam sh),
# one H200, one device call, measured at 6c28c9a (that mode and its kernel were dropped after
# this). Outputs: projection/rows{4,8,16}.{json,log} (bench_projection --adam per SH_ROWS, the
# tile height of that kernel), gpu_tests_adam.log, bench-<scene>/bench.{json,md}, console.log,
# timeline.txt. At 6c28c9a --fused_adam auto meant sh on a GPU where memory is not tight, so the
# rows named ours-dense-fused ran with it and ours-dense-fused-adam-off with the separate launch.
for rows in 4 8 16; do
  python -c "
import sys; from splat_train.kernels import projection; projection.SH_ROWS = $rows
from splat_train.scripts import bench_projection
sys.exit(bench_projection.main(['--gaussians', '20000000', '--adam', '--repeats', '10', '--json', 'projection/rows$rows.json']))" > projection/rows$rows.log
done
# SH_ROWS 8 (the fastest) for the rest
python -m pytest -q -s -m gpu tests/test_projection_kernel.py tests/test_gpu.py -k "gpu_adam_in_the_backward or gpu_bench_script or (adam_in_the_projection_backward and sh)"
V="--steps 12 --warmup 4 --phase_steps 3 --profile_steps 3 --world_sizes 1"
OFF="ours-dense-fused-adam-off=--raster fused --fused_adam off"
splat-train bench --synthetic_gaussians 20000000 --resolution 1920x1080 --variants gsplat-dist ours-dense-fused --variant "$OFF" $V --out bench-20m
splat-train bench --synthetic_layout city --synthetic_gaussians 20000000 --resolution 1920x1080 --variants gsplat-dist ours-dense-fused --variant "$OFF" --variant "ours-dense-fused-visible-adam=--raster fused --visible_adam" $V --out bench-city-20m
splat-train bench --synthetic_gaussians 60000000 --resolution 1920x1080 --num_cameras 4 --variants ours-dense-fused --variant "$OFF" --steps 8 --warmup 3 --phase_steps 2 --profile_steps 2 --world_sizes 1 --out bench-60m
