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
# - waiting-rows/: at 2133ee3 (the catch-up over the list of waiting rows; the kernels as 40be37c),
#   one H200, STEP_TESTS=0 JUICEBOX=0 SCRATCH_MBS=8192 (bench-20m-scratch8192: the fused kernel
#   in one launch); gpu.txt's commit line is again the session's starting checkout.
# - ../fused-scratch/: the next call on the same machine, 2133ee3 with the step plan's scratch size
#   (trainer/step/plan.scratch_mode; committed after it unchanged but for --fused_adam's case),
#   STEP_TESTS=0 LAZY_TESTS=0 SCENES=20m; its juicebox runs found no data (J pointed outside the
#   carried tree: timeline.txt) and are not kept.
# - juicebox-base/ (replaced by ../juicebox-f4/; in git history): at 05350b7, J=.data/juicebox (images_4/ and sparse/ copied into an ignored folder
#   and carried), WARM_STEPS=3100 (past the last SH degree step, so Triton's cache holds every
#   projection kernel before the timed runs), STEP_TESTS=0 LAZY_TESTS=0 SCENES=, one H100 (the H200
#   did not come); gpu_tests_adam.log there is from the call before it (ab08f61, one H100: the four
#   lazy/Adam GPU kernel tests).
# Run from the repository root after `source .whl/gpu-prelude.sh`; R: where the outputs go;
# STEP_TESTS=0 / LAZY_TESTS=0 / JUICEBOX=0 leave those parts out; SCENES: the bench scenes (default
# "city-20m 20m"; empty for none).
R=${R:-$OUT/r}; mkdir -p $R; t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $R/timeline.txt; }
nvidia-smi > $R/gpu.txt 2>&1; git log -1 --format='%H %s' >> $R/gpu.txt 2>/dev/null
[ "${LAZY_TESTS:-1}" = 1 ] && python3 -m pytest -q -s -m gpu tests/test_lazy_adam.py tests/test_adam.py > $R/gpu_tests_lazy.log 2>&1
stamp "lazy tests rc=$? $(tail -1 $R/gpu_tests_lazy.log)"
[ "${STEP_TESTS:-1}" = 1 ] && python3 -m pytest -q -m gpu tests/test_projection_kernel.py tests/test_gpu.py -k "steady_state or adam or graphed or gpu_matches or replay" > $R/gpu_tests_step.log 2>&1
stamp "step tests rc=$? $(tail -1 $R/gpu_tests_step.log)"
V="--steps 12 --warmup 4 --phase_steps 3 --profile_steps 3 --world_sizes 1"
DENSE=(--variant "ours-dense-fused-dense-sh=--raster fused --lazy_sh_adam off")
for scene in ${SCENES-city-20m 20m}; do
  layout=(); [ $scene = city-20m ] && layout=(--synthetic_layout city)
  mkdir -p $R/bench-$scene
  splat-train bench "${layout[@]}" --synthetic_gaussians 20000000 --resolution 1920x1080 \
    --variants gsplat-dist ours-dense-fused "${DENSE[@]}" $V --out $R/bench-$scene > $R/bench-$scene/console.log 2>&1
  stamp "bench-$scene rc=$? $(grep -h 'ms/iter' $R/bench-$scene/console.log | tr '\n' ';')"
done
# SCRATCH_MBS: the all-visible 20 M again with the fused kernel's checkpoint scratch capped at each
# of these sizes (SPLAT_TRAIN_FUSED_SCRATCH_MB; the former fixed 2048 split its launch into chunks there)
for mb in ${SCRATCH_MBS:-}; do
  mkdir -p $R/bench-20m-scratch$mb
  SPLAT_TRAIN_FUSED_SCRATCH_MB=$mb splat-train bench --synthetic_gaussians 20000000 --resolution 1920x1080 \
    --variants ours-dense-fused "${DENSE[@]}" $V --out $R/bench-20m-scratch$mb > $R/bench-20m-scratch$mb/console.log 2>&1
  stamp "bench-20m-scratch$mb rc=$? $(grep -h 'ms/iter' $R/bench-20m-scratch$mb/console.log | tr '\n' ';')"
done
# juicebox f4 (images_4/), 7,000 steps of the default preset, this tree ("head") beside 22b3dbb
# ("base": its source, `git archive --prefix=splat_train/ 22b3dbb | gzip`, carried as BASE_SRC),
# alternating, each with its own native-extension cache and a warm-up first (WARM_STEPS, default 300).
[ "${JUICEBOX:-1}" = 1 ] || exit 0
# J: juicebox; on the device machine only the carried tree exists, so copy images_4/, sparse/ and
# poses_bounds.npy of ../shared/data/juicebox into .data/juicebox (ignored) and carry .data
J=${J:-$([ -d .data/juicebox ] && echo .data/juicebox || echo ../shared/data/juicebox)}
BASE_SRC=${BASE_SRC:-.whl/base-22b3dbb.tar.gz}
mkdir -p /tmp/base && tar -xzf $BASE_SRC -C /tmp/base || exit 1
FLAGS="--data_dir $J --data_factor 4 --max_steps 7000 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply"
train() {  # commit (head|base), seed, steps, output folder; the rest: extra flags
  local commit=$1 seed=$2 steps=$3 out=$4; shift 4
  local path=$PYTHONPATH; [ $commit = base ] && path=/tmp/base:$PYTHONPATH
  mkdir -p $out
  PYTHONPATH=$path SPLAT_TRAIN_CACHE=/tmp/cache_$commit timeout 120 python3 -m splat_train.trainer.cli default \
    $FLAGS --seed $seed --max_steps $steps --result_dir /tmp/j/$commit$seed "$@" > $out/train.log 2>&1
}
for commit in base head; do
  train $commit 7 ${WARM_STEPS:-300} $R/juicebox-warm-$commit --eval_steps 99999
  stamp "warm $commit rc=$?"
done
for seed in ${SEEDS:-42 43 44}; do
  for commit in base head; do
    train $commit $seed 7000 $R/juicebox-$commit-$seed
    rc=$?; cp -r /tmp/j/$commit$seed/stats $R/juicebox-$commit-$seed/
    stamp "juicebox $commit $seed rc=$rc $(tr '\r' '\n' < $R/juicebox-$commit-$seed/train.log | grep 'train loop:\|PSNR' | tr '\n' ';' | cut -c1-300)"
  done
done
