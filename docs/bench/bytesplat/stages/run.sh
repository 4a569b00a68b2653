# The bytesplat preset on juicebox f2 (7,000 steps: --steps_scaler 0.233334 puts stage 2 at step
# 3,500 and stage 3 at 4,666), alone on one H200 at c354b0d (the GPU validation call of the step
# package, the Triton projection and the batched pruning stages; images_2 made from images/ with
# OpenCV's INTER_AREA). Outputs: train.log (the run's lines, progress bar left out),
# stats/prune_stage{2,3}.json (Gaussians, tiles within the budget, seconds, test PSNR before and
# after), stats/val_step*.json, stats/train_step*_rank0.json.
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}
splat-train bytesplat --data_dir $J --data_factor 2 --steps_scaler 0.233334 --seed 1 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply --result_dir $R/bs > train.log 2>&1
