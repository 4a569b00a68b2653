# A base tree's default step on the bench scenes (BASE_SRC: `git archive --prefix=splat_train/
# <commit> | gzip`; f71f057, before the changes for unseen Gaussians, 8664e0e, before the
# backward over the list of seen ones, b62d4bc, before the deferral's rule of the share a step
# sees and the listed backward), to set beside ../show/'s invocation of the same scene on the same
# machine in the same device call; with the GPU tests of the changed kernels first
# (gpu_tests.log). Each base-<scene>/: bench.json (phases, profile summary, bytes
# model), bench.md, console.log; timeline.txt: each part's exit and ms/iter.
# Run from the repository root after `source .whl/gpu-prelude.sh`; R: where the outputs go; SCENES
# (default "city-20m"; also 20m, all visible); TESTS=0 leaves the tests out.
R=${R:-$OUT/r}; mkdir -p $R; t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $R/timeline.txt; }
if [ "${TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -m gpu tests/test_projection_kernel.py tests/test_lazy_adam.py tests/test_prewarm.py \
    tests/test_densify_stats.py > $R/gpu_tests.log 2>&1
  stamp "gpu tests rc=$? $(tail -1 $R/gpu_tests.log)"
fi
BASE_SRC=${BASE_SRC:-.whl/base-b62d4bc.tar.gz}
mkdir -p /tmp/base && tar -xzf $BASE_SRC -C /tmp/base || exit 1
V="--steps 12 --warmup 4 --phase_steps 3 --profile_steps 3 --world_sizes 1"
for scene in ${SCENES-city-20m}; do
  layout=(); [ $scene = city-20m ] && layout=(--synthetic_layout city)
  mkdir -p $R/base-$scene
  PYTHONPATH=/tmp/base:$PYTHONPATH python3 -m splat_train.trainer.cli bench --variants ours-dense-fused \
    "${layout[@]}" --synthetic_gaussians 20000000 --resolution 1920x1080 $V --out $R/base-$scene \
    > $R/base-$scene/console.log 2>&1
  stamp "base-$scene rc=$? $(grep -h 'ms/iter' $R/base-$scene/console.log | tr '\n' ';')"
done
