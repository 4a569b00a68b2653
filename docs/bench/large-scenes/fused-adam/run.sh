# Adam in the projection's backward (--fused_adam) beside the separate Adam launch, one H200, one
# device call, measured at 5968a0c, where --fused_adam auto meant on wherever it applies: the rows
# named ours-dense and ours-dense-fused (and the 60 M and 100 M rows) ran with Adam in the
# backward, ours-dense-fused-adam-off with the separate launch (today's default where the model
# fits: --fused_adam auto). Outputs: bench-<scene>/bench.{json,md}, console.log, timeline.txt.
V="--steps 12 --warmup 4 --phase_steps 3 --profile_steps 3 --world_sizes 1"
splat-train bench --synthetic_gaussians 20000000 --resolution 1920x1080 --variants gsplat-dist ours-dense ours-dense-fused --variant "ours-dense-fused-adam-off=--raster fused --fused_adam off" $V --out bench-20m
splat-train bench --synthetic_layout city --synthetic_gaussians 20000000 --resolution 1920x1080 --variants gsplat-dist ours-dense-fused --variant "ours-dense-fused-adam-off=--raster fused --fused_adam off" --variant "ours-dense-fused-visible-adam=--raster fused --visible_adam" $V --out bench-city-20m
splat-train bench --synthetic_gaussians 60000000 --resolution 1920x1080 --num_cameras 4 --variants ours-dense-fused --steps 8 --warmup 3 --phase_steps 2 --world_sizes 1 --out bench-60m
splat-train bench --synthetic_gaussians 100000000 --resolution 1920x1080 --num_cameras 4 --variants ours-dense-fused --steps 8 --warmup 3 --phase_steps 2 --world_sizes 1 --out bench-100m
# GPU tests, run again at 5910ea4 (the kernel comparison against a float64 reference, the trainer
# runs on / off / control with the widened bound): gpu_tests_adam.log, their printed errors
python -m pytest -q -s -m gpu tests/test_projection_kernel.py tests/test_gpu.py -k "adam"
