# gsplat simple_trainer's options on juicebox f4, 7,000 steps, on one H200 at f9f355b. The 15 runs of
# options/ and masked/fixed_rectangle_scores.txt ran at once on the GPU, then the 6 runs of
# masked/moving_rectangle_scores.txt: their ms/step are not speed figures.
# options/<flags>_s<seed>/val_step7000.json: test PSNR and Gaussians. The score files name the runs
# i21_<flags>_s<seed> (fixed rectangle) and i21m_<flags>_s<seed> (moving), the folder names they ran in.
set -o pipefail
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}; mkdir -p $R
python3 -m splat_train.scripts.masked_capture make $J /tmp/painted                    # a fixed rectangle
python3 -m splat_train.scripts.masked_capture make $J /tmp/painted-moving --moving    # through the quadrants
RUN="--data_factor 4 --max_steps 7000 --eval_steps 7000 --save_steps 7000 --ply_steps 7000 --num_traj_frames 0"
for seed in 1 2 3; do
  splat-train default $RUN --data_dir $J --seed $seed --result_dir $R/default_s$seed &
  splat-train default $RUN --data_dir $J --absgrad --grow_grad2d 0.0008 --seed $seed --result_dir $R/absgrad_s$seed &
  splat-train default $RUN --data_dir $J --antialiased --seed $seed --result_dir $R/antialiased_s$seed &
  splat-train default $RUN --data_dir /tmp/painted --seed $seed --result_dir $R/masked_s$seed &
  splat-train default $RUN --data_dir /tmp/painted-unmasked --seed $seed --result_dir $R/unmasked_s$seed &
done
wait
for run in $R/default_s* $R/masked_s* $R/unmasked_s*; do
  python3 -m splat_train.scripts.masked_capture score $run --step 7000 | tail -1
done > masked/fixed_rectangle_scores.txt
for seed in 1 2; do
  splat-train default $RUN --data_dir $J --seed $seed --result_dir $R/m_default_s$seed &
  splat-train default $RUN --data_dir /tmp/painted-moving --seed $seed --result_dir $R/m_masked_s$seed &
  splat-train default $RUN --data_dir /tmp/painted-moving-unmasked --seed $seed --result_dir $R/m_unmasked_s$seed &
done
wait
for run in $R/m_*; do
  python3 -m splat_train.scripts.masked_capture score $run --step 7000 --moving | tail -1
done > masked/moving_rectangle_scores.txt
