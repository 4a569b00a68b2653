# The large-scenes issue's bench: one invocation per scene (20 M all visible, city-like 20 M, 2 M
# all visible at 1600x1200, 60 M all visible with 4 cameras), gsplat's distributed pass, the
# unfused dense step and the default step (the fused kernel) side by side from the same initial
# model at W = 1, warm-up steps discarded; SCENES may add 100m (100 M all visible, 4 cameras, the
# default step alone: what one rank of an 800 M model sharded over 8 GPUs holds).
# Each bench-<scene>/: bench.json (phases, peak memory, the profile summary and the bytes model of
# the per-Gaussian stages), bench.md, console.log; timeline.txt: each part's exit and ms/iter.
# Run from the repository root after `source .whl/gpu-prelude.sh`; R: where the outputs go;
# SCENES: the scenes (default "20m city-20m 2m 60m"); VARIANTS: the bench variants (default
# "gsplat-dist ours-dense ours-dense-fused"); EXTRA: more bench arguments for every scene (a
# --variant NAME="--flags" to compare).
# ../presort/ ran an earlier form of this script (cce9146: kernels/isect.py's presorted tile
# lists, --tile_lists, in the default step, and a variant with gsplat's lists beside it).
R=${R:-$OUT/r}; mkdir -p $R; t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $R/timeline.txt; }
nvidia-smi > $R/gpu.txt 2>&1
V="--steps 12 --warmup 4 --phase_steps 3 --profile_steps 3 --world_sizes 1"
for scene in ${SCENES-20m city-20m 2m 60m}; do
  case $scene in
    20m) args=(--synthetic_gaussians 20000000 --resolution 1920x1080 $V) ;;
    city-20m) args=(--synthetic_layout city --synthetic_gaussians 20000000 --resolution 1920x1080 $V) ;;
    2m) args=(--synthetic_gaussians 2000000 --resolution 1600x1200 $V) ;;
    60m) args=(--synthetic_gaussians 60000000 --resolution 1920x1080 --num_cameras 4 --steps 8 --warmup 3
               --phase_steps 2 --profile_steps 2 --world_sizes 1) ;;
    100m) args=(--synthetic_gaussians 100000000 --resolution 1920x1080 --num_cameras 4 --steps 8 --warmup 3
                --phase_steps 2 --profile_steps 2 --world_sizes 1) ;;
  esac
  variants=(${VARIANTS:-gsplat-dist ours-dense ours-dense-fused}); [ $scene = 100m ] && variants=(ours-dense-fused)
  mkdir -p $R/bench-$scene
  eval "extra=(${EXTRA:-})"
  splat-train bench --variants "${variants[@]}" "${args[@]}" "${extra[@]}" --out $R/bench-$scene \
    > $R/bench-$scene/console.log 2>&1
  stamp "bench-$scene rc=$? $(grep -h 'ms/iter' $R/bench-$scene/console.log | tr '\n' ';')"
done
