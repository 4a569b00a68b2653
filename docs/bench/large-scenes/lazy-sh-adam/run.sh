# The SH Adam deferred for unseen Gaussians (--lazy_sh_adam, kernels/lazy_adam.py) beside the dense
# one (--lazy_sh_adam off, the step before it), one H200, one device call: the GPU tests first
# (gpu_tests_*.log), then one bench invocation per scene with gsplat-dist, the default step (the
# deferred SH Adam where it applies) and the dense SH Adam side by side, warm-up steps discarded;
# then juicebox f4 (images_4/) trained with and without it, two seeds each, one after the other.
# Each bench-<scene>/: bench.json (with the profile summary), bench.md, console.log.
# Two device calls on one H100 each (not an H200: the H200 did not come), both with
# --lazy_sh_adam auto meaning on for every run here:
# - this folder (gpu.txt, timeline.txt, gpu_tests_lazy.log, bench-*): at a8595b3's kernels (the
#   catch-up one coefficient at a time, in a kernel after the forward), STEP_TESTS=0 JUICEBOX=0;
# - tiles/ and juicebox-f4/: one call earlier, at 3dabcfd (the catch-up in [BLOCK, 8] tiles of
#   coefficients, 235 registers), with the step tests and the juicebox runs (train.log without the
#   progress bar, stats/).
# - listed/: at aa76b67 (the catch-up, the Adam's SH rows and the stamp striding over the
#   list of seen Gaussians, the backward leaving unseen SH gradient rows unwritten), one H100,
#   STEP_TESTS=0 JUICEBOX=0.
# - listed-rows/: at 4806135 with SPLAT_CATCH_UP=listed (that commit's switch: the catch-up over the list
#   of seen rows with lanes along each row, the tile's waiting rows found by reading every listed
#   row's count), one H100, STEP_TESTS=0 JUICEBOX=0; gpu.txt's commit line is the session's
#   starting checkout, not the tree that ran.
# Run from the repository root after `source .whl/gpu-prelude.sh`; R: where the outputs go;
# STEP_TESTS=0 / JUICEBOX=0 leave those parts out.
R=${R:-$OUT/r}; mkdir -p $R; t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $R/timeline.txt; }
nvidia-smi > $R/gpu.txt 2>&1; git log -1 --format='%H %s' >> $R/gpu.txt 2>/dev/null
python3 -m pytest -q -s -m gpu tests/test_lazy_adam.py tests/test_adam.py > $R/gpu_tests_lazy.log 2>&1
stamp "lazy tests rc=$? $(tail -1 $R/gpu_tests_lazy.log)"
[ "${STEP_TESTS:-1}" = 1 ] && python3 -m pytest -q -m gpu tests/test_projection_kernel.py tests/test_gpu.py -k "steady_state or adam or graphed or gpu_matches or replay" > $R/gpu_tests_step.log 2>&1
stamp "step tests rc=$? $(tail -1 $R/gpu_tests_step.log)"
V="--steps 12 --warmup 4 --phase_steps 3 --profile_steps 3 --world_sizes 1"
DENSE=(--variant "ours-dense-fused-dense-sh=--raster fused --lazy_sh_adam off")
for scene in city-20m 20m; do
  layout=(); [ $scene = city-20m ] && layout=(--synthetic_layout city)
  mkdir -p $R/bench-$scene
  splat-train bench "${layout[@]}" --synthetic_gaussians 20000000 --resolution 1920x1080 \
    --variants gsplat-dist ours-dense-fused "${DENSE[@]}" $V --out $R/bench-$scene > $R/bench-$scene/console.log 2>&1
  stamp "bench-$scene rc=$? $(grep -h 'ms/iter' $R/bench-$scene/console.log | tr '\n' ';')"
done
# juicebox f4, 7,000 steps, the deferred SH Adam (--lazy_sh_adam on: auto leaves it off below 2 M
# Gaussians) and --lazy_sh_adam off, alternating
[ "${JUICEBOX:-1}" = 1 ] || exit 0
J=${J:-../shared/data/juicebox}
FLAGS="--data_dir $J --data_factor 4 --max_steps 7000 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply"
splat-train default $FLAGS --max_steps 300 --eval_steps 99999 --seed 7 --result_dir /tmp/jw > $R/warm.log 2>&1
for seed in 42 43; do
  for mode in on off; do
    mkdir -p $R/juicebox-$mode-$seed
    splat-train default $FLAGS --seed $seed --lazy_sh_adam $mode --result_dir /tmp/j$mode$seed > $R/juicebox-$mode-$seed/train.log 2>&1
    cp -r /tmp/j$mode$seed/stats $R/juicebox-$mode-$seed/
    stamp "juicebox $mode $seed rc=$? $(grep -h 'train loop:\|PSNR' $R/juicebox-$mode-$seed/train.log | tr '\n' ';' | cut -c1-300)"
  done
done
