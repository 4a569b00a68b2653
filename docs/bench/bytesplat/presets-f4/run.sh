# The bytesplat preset against the default preset on juicebox f4 (480x270), 7,000 steps each
# (--steps_scaler 0.233334 for both), one run after the other on one H200 at 5910ea4, in a device
# call whose time ran out after seed 2 (seed 3 did not run). Outputs: <run>/process.json (wall time
# of the whole process), <run>/train.log, <run>/stats/*.json, timeline.txt (the call's; its first
# lines are GPU tests).
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}
COMMON="--data_dir $J --data_factor 4 --steps_scaler 0.233334 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply"
for seed in 1 2 3; do
  for preset in bytesplat default; do
    /usr/bin/time -f %e splat-train $preset $COMMON --seed $seed --result_dir $R/${preset}_$seed > ${preset}_$seed/train.log 2>&1
  done
done
