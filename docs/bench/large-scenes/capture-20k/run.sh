# A dataset 14x its image cache, on one H200 at d1d9964: the 20,000-frame capture made from
# juicebox (29.0 GiB of decoded images), streamed under --image_cache_gb 2.
#  rss_stream20k.json / rss_device_f2.json: peak RSS of a 1,000-step run on it (console:
#    stream20k.log, with the image cache's own line), and of the
#    device-resident juicebox f2 run of the same length (peak_rss.py: the child's ru_maxrss);
#  bench_20k/ and bench_f2/: steady-state ms/iter with the same model (a juicebox f2 checkpoint,
#    2,000 timed steps after 200), two variants each; bench takes one --data_dir per invocation.
set -o pipefail
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}; mkdir -p $R
python3 -m splat_train.scripts.repeat_capture $J /tmp/jb20k --frames 20000 --data_factor 2
P="--data_factor 2 --max_steps 1000 --eval_steps 30000 --save_steps 30000 --ply_steps 30000 --no_save_ply --num_traj_frames 0 --test_every 0"
python3 peak_rss.py rss_stream20k.json splat-train default --data_dir /tmp/jb20k $P --device_images_share 0 --image_cache_gb 2 --result_dir $R/stream20k > stream20k.log 2>&1
python3 peak_rss.py rss_device_f2.json splat-train default --data_dir $J $P --result_dir $R/device_f2
splat-train default --data_dir $J --data_factor 2 --max_steps 3000 --eval_steps 30000 --save_steps 3000 --no_save_ply --num_traj_frames 0 --result_dir $R/f2
CK=$(ls $R/f2/ckpts/*.pt | head -1)
B="--data_factor 2 --ckpt $CK --world_sizes 1 --variants none --steps 2200 --warmup 200 --phase_steps 5"
splat-train bench --data_dir $J $B --variant device_1= --variant device_2= --out bench_f2
S20="--test_every 0 --device_images_share 0 --image_cache_gb 2"
splat-train bench --data_dir /tmp/jb20k $B --variant "streamed20k_1=$S20" --variant "streamed20k_2=$S20" --out bench_20k
