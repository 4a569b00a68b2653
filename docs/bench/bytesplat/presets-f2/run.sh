# The bytesplat preset against the default preset on juicebox f2 (960x540), 7,000 steps each
# (--steps_scaler 0.233334 for both: densification to step 3,500; the preset's stage 2 at 3,500 and
# stage 3 at 4,666), seeds 1-3, one run after the other on one H200 in one device call at 5910ea4,
# after a short preset run to fill the Triton cache (warm.log; it stopped at its time limit before
# its stages, so bytesplat_1's stages still compiled the scoring kernel). Then a stage-2-only
# control of seed 1 (--prune_stage3_step 0) and, from the final checkpoints of bytesplat_1 and
# stage2only_1, the fused kernel time (bench-raster) and whole W = 1 iterations (bench).
# Outputs: <run>/process.json (wall time of the whole process), <run>/train.log, <run>/stats/*.json,
# stage3-speed/br_<run>/bench_raster.{json,md}, stage3-speed/bench_<run>/bench.{json,md}, timeline.txt.
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}
COMMON="--data_dir $J --data_factor 2 --steps_scaler 0.233334 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply"
for seed in 1 2 3; do
  for preset in bytesplat default; do
    /usr/bin/time -f %e splat-train $preset $COMMON --seed $seed --result_dir $R/${preset}_$seed > ${preset}_$seed/train.log 2>&1
  done
done
splat-train bytesplat $COMMON --seed 1 --prune_stage3_step 0 --result_dir $R/stage2only_1 > stage2only_1/train.log 2>&1
for m in bytesplat_1 stage2only_1; do
  splat-train bench-raster --data_dir $J --data_factor 2 --ckpt $R/$m/ckpts/ckpt_7000_rank0.pt --profile 5 --out stage3-speed/br_$m
  splat-train bench --data_dir $J --data_factor 2 --ckpt $R/$m/ckpts/ckpt_7000_rank0.pt --variants ours-dense-fused --world_sizes 1 --steps 300 --warmup 60 --phase_steps 5 --profile_steps 10 --out stage3-speed/bench_$m
done
