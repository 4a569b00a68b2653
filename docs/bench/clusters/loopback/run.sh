# One process through the distributed path (--loopback: a process group of one rank over NCCL, none
# of the one-process shortcuts) against the one-process step, on one H200 at 5d42830, in one device
# call (gpu.txt): the NCCL loopback GPU tests first, then per juicebox factor a 7,000-step run of the
# default step (train.log, train_val_step7000.json) whose checkpoint the bench starts from, then the
# 2 M synthetic scene from its initial model (with gsplat-dist and the unfused step beside: the
# large-scenes 2 M row). Rows: ours-dense-fused = the one-process default step (whole-step graphs);
# -loopback = the distributed path, eager (--cuda_graphs auto); -loopback-graphs = the distributed
# path with --cuda_graphs on (the whole step, the record exchanges captured). bench.json ranks carry
# the profile summary (GPU-busy share, host syncs, kernels per step).
J=${J:-../shared/data/juicebox}  # images_2 made from images/ with Pillow (LANCZOS, exact /2, JPEG quality 95)
python -m pytest -q -s -m gpu tests/test_loopback.py -k "graphs_equal or record_exchange or training_equals" > gpu_tests.log 2>&1
LV=(--variants ours-dense-fused ours-dense-fused-loopback ours-dense-fused-loopback-graphs --world_sizes 1)
for f in 4 2; do
  splat-train default --data_dir $J --data_factor $f --max_steps 7000 --save_steps 7000 --eval_steps 7000 \
    --ply_steps 99999 --no_save_ply --num_traj_frames 0 --result_dir /tmp/jb$f > juicebox-f$f/train.log 2>&1
  splat-train bench --data_dir $J --data_factor $f --ckpt /tmp/jb$f/ckpts/ckpt_7000_rank0.pt "${LV[@]}" --steps 300 \
    --warmup 60 --phase_steps 5 --profile_steps 10 --out juicebox-f$f > juicebox-f$f/console.log 2>&1
done
splat-train bench --synthetic_gaussians 2000000 --resolution 1600x1200 --world_sizes 1 \
  --variants gsplat-dist ours-dense ours-dense-fused ours-dense-fused-loopback ours-dense-fused-loopback-graphs \
  --steps 40 --warmup 10 --phase_steps 5 --profile_steps 5 --out synthetic-2m > synthetic-2m/console.log 2>&1
# interleaved-2m/: the same 2 M invocation one device call earlier, at the first form of the captured
# exchange (a form of graphed_exchange.py never committed, which packed and joined interleaved
# 12-lane rows as the eager exchange does, instead of fb05910's field-major blocks)
