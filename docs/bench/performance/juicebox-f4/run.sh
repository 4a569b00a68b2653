# juicebox at --data_factor 4 (480x270), 7,000 steps of the default preset, three seeds, this
# commit beside 22b3dbb (the commit before the step package and the Triton projection), the runs
# one after the other on one H200, alternating. Outputs: <commit>_<seed>/train.log (the run's
# lines, progress bar left out), <commit>_<seed>/stats/*.json.
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}
FLAGS="--data_dir $J --data_factor 4 --max_steps 7000 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply"
for seed in 42 43 44; do
  for commit in base head; do  # base: a checkout of 22b3dbb on PYTHONPATH; head: this commit
    splat-train default $FLAGS --seed $seed --result_dir $R/${commit}_$seed > ${commit}_$seed/train.log 2>&1
  done
done
