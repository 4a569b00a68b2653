# The 20,000-frame capture made from juicebox on the project's 2-core, 24 GiB CPU machine (at
# 891d844, other jobs running): every image decoded up front (refused before decoding), then
# streamed under a 2 GiB cache (trained). Each log ends with /usr/bin/time -v's report (peak RSS).
J=${J:-../shared/data/juicebox}
python3 -m splat_train.scripts.repeat_capture $J /tmp/big/jb20k --frames 20000 --data_factor 2
/usr/bin/time -v python -m splat_train.trainer.cli default --data_dir /tmp/big/jb20k --data_factor 2 --device cpu --test_every 0 --max_steps 3 --num_traj_frames 0 --result_dir /tmp/big/preload > preload_refused.log 2>&1
/usr/bin/time -v python -m splat_train.trainer.cli default --data_dir /tmp/big/jb20k --data_factor 2 --device cpu --test_every 0 --max_steps 2 --num_traj_frames 0 --image_cache_gb 2 --result_dir /tmp/big/stream > stream_2GiB.log 2>&1
