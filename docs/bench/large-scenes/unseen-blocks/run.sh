# The backward projection's blocks of unseen Gaussians (no math, zero gradients stored) and the
# deferred SH rows' colours written by their own kernel, one lane per listed Gaussian, against the
# tree before them (BASE_SRC, `git archive --prefix=splat_train/ f71f057 | gzip`), one device call:
# the GPU tests of the kernels first (gpu_tests.log), then per scene one bench invocation of this
# tree (gsplat-dist and the default step side by side) and one of the base tree's default step, on
# the same machine, warm-up steps discarded. Each <tree>-<scene>/: bench.json (phases, profile
# summary, bytes model), bench.md, console.log; timeline.txt: each part's exit and ms/iter.
# Run from the repository root after `source .whl/gpu-prelude.sh`; R: where the outputs go; SCENES
# (default "city-20m 20m"); TESTS=0 leaves the tests out.
R=${R:-$OUT/r}; mkdir -p $R; t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $R/timeline.txt; }
nvidia-smi > $R/gpu.txt 2>&1
if [ "${TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -m gpu tests/test_projection_kernel.py tests/test_lazy_adam.py tests/test_prewarm.py \
    > $R/gpu_tests.log 2>&1
  stamp "gpu tests rc=$? $(tail -1 $R/gpu_tests.log)"
fi
BASE_SRC=${BASE_SRC:-.whl/base-f71f057.tar.gz}
mkdir -p /tmp/base && tar -xzf $BASE_SRC -C /tmp/base || exit 1
V="--steps 12 --warmup 4 --phase_steps 3 --profile_steps 3 --world_sizes 1"
for scene in ${SCENES-city-20m 20m}; do
  layout=(); [ $scene = city-20m ] && layout=(--synthetic_layout city)
  args=("${layout[@]}" --synthetic_gaussians 20000000 --resolution 1920x1080 $V)
  mkdir -p $R/head-$scene $R/base-$scene
  splat-train bench --variants gsplat-dist ours-dense-fused "${args[@]}" --out $R/head-$scene \
    > $R/head-$scene/console.log 2>&1
  stamp "head-$scene rc=$? $(grep -h 'ms/iter' $R/head-$scene/console.log | tr '\n' ';')"
  PYTHONPATH=/tmp/base:$PYTHONPATH python3 -m splat_train.trainer.cli bench --variants ours-dense-fused "${args[@]}" \
    --out $R/base-$scene > $R/base-$scene/console.log 2>&1
  stamp "base-$scene rc=$? $(grep -h 'ms/iter' $R/base-$scene/console.log | tr '\n' ';')"
done
