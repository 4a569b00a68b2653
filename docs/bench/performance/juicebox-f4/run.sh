# juicebox at --data_factor 4 (480x270), 7,000 steps of the default preset, "head" beside 22b3dbb
# ("base", before the step package and the Triton projection), one after the other on one H200,
# alternating, in two device calls. Each commit has its own native-extension cache directory
# (SPLAT_TRAIN_CACHE) and runs a warm-up first (warm*_<commit>.log).
# - Call 1, head = 5910ea4, seeds 42-44, 2,500-step warm-ups to fill Triton's cache; SH degree 3
#   starts at step 3,000, so head_42 still compiled the degree-3 projection kernels inside its
#   captures ("cuda graphs: 68 captures in 10.90 s"; 0.31 s for base_42); timeline.txt is that
#   call's (its first lines are GPU tests).
# - Call 2, head = 26be4b1 (the step's code as fb05910), seeds 45-47 after 300-step warm-ups
#   (base's native kernel builds there), then the head with --loopback --cuda_graphs on, seed 45
#   (loopback_45: the distributed path's whole-step replay, its record exchanges captured at every
#   densification); gpu2.txt: that call's machine.
# Outputs: <commit>_<seed>/train.log (the run's lines, progress bar left out), <commit>_<seed>/stats/*.json.
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}
FLAGS="--data_dir $J --data_factor 4 --max_steps 7000 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply"
call() {  # warm-up name, warm-up steps, seeds...; base: a checkout of 22b3dbb on PYTHONPATH; head: this commit
  local warm=$1 steps=$2; shift 2
  for commit in base head; do
    SPLAT_TRAIN_CACHE=/tmp/cache_$commit splat-train default $FLAGS --max_steps $steps --eval_steps 99999 --seed 7 --result_dir $R/${warm}_$commit > ${warm}_$commit.log 2>&1
  done
  for seed in "$@"; do
    for commit in base head; do
      SPLAT_TRAIN_CACHE=/tmp/cache_$commit splat-train default $FLAGS --seed $seed --result_dir $R/${commit}_$seed > ${commit}_$seed/train.log 2>&1
    done
  done
}
call warm 2500 42 43 44
call warm2 300 45 46 47
splat-train default $FLAGS --seed 45 --loopback --cuda_graphs on --result_dir $R/loopback_45 > loopback_45/train.log 2>&1
