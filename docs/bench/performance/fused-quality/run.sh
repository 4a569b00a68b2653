# Test PSNR of the fused step against the unfused one: juicebox f4, 7,000 steps, seeds 6-19, one run
# per seed and raster, on one H200 at 81ee1e7 (the 14 runs of seeds 6-12 at once, then the 14 of
# seeds 13-19 at once: their ms/step are not speed figures). Outputs: q_<raster>_s<seed>/stats/
# val_step7000.json; `python quality.py .` prints the table.
set -o pipefail
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}; mkdir -p $R
RUN="--data_factor 4 --max_steps 7000 --eval_steps 7000 --save_steps 30000 --ply_steps 30000 --num_traj_frames 0"
for seeds in "6 7 8 9 10 11 12" "13 14 15 16 17 18 19"; do
  for seed in $seeds; do
    for v in unfused fused; do
      splat-train default $RUN --data_dir $J --raster $v --seed $seed --result_dir $R/q_${v}_s$seed > $R/q_${v}_s$seed.log 2>&1 &
    done
  done
  wait
done
