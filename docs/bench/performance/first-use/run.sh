# The first training run on a fresh H200 machine (empty Triton cache): its `cuda graphs:` line
# counts the time of the whole-step tail captures, the first of which compiles the loss's Triton
# kernels. train_f2_warm.log: a 100-step run (at 78ee4b8); train_f2.log: a 3,000-step run on
# another fresh machine (at d1d9964).
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}
P="--data_dir $J --data_factor 2 --max_steps 3000 --eval_steps 3000 --ply_steps 30000 --num_traj_frames 0 --no_save_eval_images"
splat-train default $P --save_steps 30000 --max_steps 100 --eval_steps 100 --result_dir $R/warm > train_f2_warm.log 2>&1
splat-train default $P --save_steps 3000 --result_dir $R/f2 > train_f2.log 2>&1
grep -a "cuda graphs" train_f2_warm.log train_f2.log
