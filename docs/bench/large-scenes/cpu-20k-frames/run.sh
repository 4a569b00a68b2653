# The 20,000-frame capture made from juicebox on the project's 2-core, 24 GiB CPU machine (at
# 891d844, other jobs running): every image decoded up front (refused), then streamed under a
# 2 GiB cache (trained).
J=${J:-../shared/data/juicebox}
python3 -m splat_train.scripts.repeat_capture $J /tmp/big/jb20k --frames 20000 --data_factor 2
splat-train default --data_dir /tmp/big/jb20k --data_factor 2 --device cpu --test_every 0 --max_steps 3 > preload_refused.log 2>&1
splat-train default --data_dir /tmp/big/jb20k --data_factor 2 --device cpu --test_every 0 --max_steps 2 --image_cache_gb 2 > stream_2GiB.log 2>&1
