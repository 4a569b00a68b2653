# juicebox at --data_factor 4 (480x270), 7,000 steps of the default preset, 493b377 ("head")
# beside 22b3dbb ("base", before the step package and the Triton projection), one after the
# other on one H200, alternating, on a machine whose Triton cache started empty. The call's time
# ran out after base_42, head_42 and base_43: seeds 43 (head) and 44 did not run. head_42 paid the
# first-use compilation of the Triton projection kernels inside its captures ("cuda graphs: 68
# captures in 19.37 s", against 0.39 s for base_42). Outputs: <commit>_<seed>/train.log (the
# run's lines, progress bar left out), <commit>_<seed>/stats/*.json.
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}
FLAGS="--data_dir $J --data_factor 4 --max_steps 7000 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply"
for seed in 42 43 44; do
  for commit in base head; do  # base: a checkout of 22b3dbb on PYTHONPATH; head: this commit
    splat-train default $FLAGS --seed $seed --result_dir $R/${commit}_$seed > ${commit}_$seed/train.log 2>&1
  done
done
