# The bytesplat preset on juicebox f2 (7,000 steps: --steps_scaler 0.233334 puts stage 2 at step
# 3,500 and stage 3 at 4,666), on one H200 at 81ee1e7, trained beside a default run (the GPU and
# the host shared: its stage and step times are upper bounds). Outputs: cfg.yml, train.log,
# stats/prune_stage{2,3}.json (Gaussians, tiles within the budget, the stage's seconds, test PSNR
# before and after), stats/val_step7000.json, stats/train_step7000_rank0.json.
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}
splat-train bytesplat --data_dir $J --data_factor 2 --steps_scaler 0.233334 --eval_steps 30000 --ply_steps 99999 --num_traj_frames 0 --result_dir $R/ck_bytesplat > train.log 2>&1
