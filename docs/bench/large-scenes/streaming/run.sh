# Streamed images against device-resident and pinned ones in the steady state, on one H200 at
# d1d9964: `splat-train bench` from a juicebox f2 checkpoint (3,000 default steps), 2,000 timed
# steps after 200 warm-up ones per variant (no densification or evaluation in the timed loop), the
# five paths interleaved three times in one invocation. Output: bench.{md,json}.
#   device_N     device-resident uint8 images (the default)
#   pinned_N     pinned host memory, the next batch copied a step ahead
#   streamed_N   a cache of half the training images (0.05 GiB), 8 decode threads: one decode per step
#   streamed2_N  the same with 2 decode threads
#   cached_N     a cache that holds every image (decoded once)
set -o pipefail
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}; mkdir -p $R
splat-train default --data_dir $J --data_factor 2 --max_steps 3000 --eval_steps 3000 --save_steps 3000 --ply_steps 30000 --num_traj_frames 0 --no_save_eval_images --result_dir $R/f2
CK=$(ls $R/f2/ckpts/*.pt | head -1)
V=()
for rep in 1 2 3; do
  V+=(--variant "device_$rep=" --variant "pinned_$rep=--device_images_share 0" --variant "streamed_$rep=--device_images_share 0 --image_cache_gb 0.05" --variant "streamed2_$rep=--device_images_share 0 --image_cache_gb 0.05 --decode_threads 2" --variant "cached_$rep=--device_images_share 0 --image_cache_gb 0.2")
done
splat-train bench --data_dir $J --data_factor 2 --ckpt $CK --world_sizes 1 --variants gsplat-dist "${V[@]}" --steps 2200 --warmup 200 --phase_steps 5 --out .
