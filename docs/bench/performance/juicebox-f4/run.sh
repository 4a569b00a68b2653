# juicebox at --data_factor 4 (480x270), 7,000 steps of the default preset, 5910ea4 ("head")
# beside 22b3dbb ("base", before the step package and the Triton projection), one after the other
# on one H200, alternating, in one device call. Each commit has its own native-extension cache
# directory (SPLAT_TRAIN_CACHE), and each ran a 2,500-step warm-up first (warm_<commit>.log) to
# fill its Triton cache; SH degree 3 starts at step 3,000, so head_42 still compiled the degree-3
# projection kernels inside its captures ("cuda graphs: 68 captures in 10.90 s"; 0.31 s for
# base_42). Outputs: <commit>_<seed>/train.log (the run's lines, progress bar left out),
# <commit>_<seed>/stats/*.json, timeline.txt (the device call's, whose first lines are GPU tests).
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}
FLAGS="--data_dir $J --data_factor 4 --max_steps 7000 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply"
for commit in base head; do  # base: a checkout of 22b3dbb on PYTHONPATH; head: this commit
  SPLAT_TRAIN_CACHE=/tmp/cache_$commit splat-train default $FLAGS --max_steps 2500 --eval_steps 99999 --seed 7 --result_dir $R/warm_$commit > warm_$commit.log 2>&1
done
for seed in 42 43 44; do
  for commit in base head; do
    SPLAT_TRAIN_CACHE=/tmp/cache_$commit splat-train default $FLAGS --seed $seed --result_dir $R/${commit}_$seed > ${commit}_$seed/train.log 2>&1
  done
done
# A second device call, at 26be4b1 ("head"; the step's code as fb05910): a 300-step warm-up run each
# (warm2_<commit>.log; base's native kernel builds there), then seeds 45-47 alternating the same way,
# then the head with --loopback --cuda_graphs on, seed 45 (loopback_45: the distributed path's
# whole-step replay, its record exchanges captured at every densification); gpu2.txt: the machine.
for commit in base head; do
  SPLAT_TRAIN_CACHE=/tmp/cache_$commit splat-train default $FLAGS --max_steps 300 --eval_steps 99999 --seed 7 --result_dir $R/warm2_$commit > warm2_$commit.log 2>&1
done
for seed in 45 46 47; do
  for commit in base head; do
    SPLAT_TRAIN_CACHE=/tmp/cache_$commit splat-train default $FLAGS --seed $seed --result_dir $R/${commit}_$seed > ${commit}_$seed/train.log 2>&1
  done
done
splat-train default $FLAGS --seed 45 --loopback --cuda_graphs on --result_dir $R/loopback_45 > loopback_45/train.log 2>&1
