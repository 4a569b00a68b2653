# The large-scene benches of docs/large-scenes.md and docs/performance.md on one H200, in one
# device call: each scene's bench invocation runs gsplat's distributed pass and this trainer's
# steps from the same initial model (W = 1), 12 steps after 4 of warm-up, 3 synchronized steps
# for the phase split and 3 profiled steps (bench.json: ms/iter, phases, peak memory, the trace
# summary of each variant). Outputs: bench-<scene>/bench.{json,md} and console.log;
# projection/*.{json,log}. Measured at 493b377 (20 M, city 20 M, 60 M, projection); the 2 M and
# 100 M rows did not fit the call's time.
V="--steps 12 --warmup 4 --phase_steps 3 --profile_steps 3 --world_sizes 1"
splat-train bench --synthetic_gaussians 20000000 --resolution 1920x1080 --variants gsplat-dist ours-dense ours-dense-fused $V --out bench-20m
splat-train bench --synthetic_layout city --synthetic_gaussians 20000000 --resolution 1920x1080 --variants gsplat-dist ours-dense ours-dense-fused $V --out bench-city-20m
splat-train bench --synthetic_gaussians 2000000 --resolution 1600x1200 --variants gsplat-dist ours-dense ours-dense-fused $V --out bench-2m
splat-train bench --synthetic_gaussians 60000000 --resolution 1920x1080 --num_cameras 4 --variants ours-dense-fused --steps 8 --warmup 3 --phase_steps 2 --out bench-60m
splat-train bench --synthetic_gaussians 100000000 --resolution 1920x1080 --num_cameras 4 --variants ours-dense-fused --steps 8 --warmup 3 --phase_steps 2 --out bench-100m
# the per-Gaussian stages alone: the Triton projection forward and backward against the
# activations + gsplat's projection and SH, with the bytes model's GB/s
python -m splat_train.scripts.bench_projection --gaussians 20000000 --layout all --json projection/all.json
python -m splat_train.scripts.bench_projection --gaussians 20000000 --layout tenth --json projection/tenth.json
