# The one-process step as whole-step CUDA graph replays, on one H200 at 8c4a7be (the unfused step;
# the fused step's whole-step replay came later): a full-mode profile window at juicebox f2 steps
# 3,020-3,049 (profile_f2/: summary_rank0.json, phases_rank0.json, and trace_summary.txt from
# `python3 ../shared/tools/trace_summary.py TRACE 30`), then W = 1 iterations from that run's
# checkpoint with graphs on (the default) and off (bench_f2/).
set -o pipefail
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}; O=${O:-out}; mkdir -p $R $O
splat-train default --data_dir $J --data_factor 2 --max_steps 3050 --eval_steps 3050 --ply_steps 30000 --num_traj_frames 0 \
  --profile --profile_start_step 3020 --profile_num_steps 30 --result_dir $R/f2
CK=$(ls $R/f2/ckpts/*3050*rank0.pt | head -1)
splat-train bench --data_dir $J --data_factor 2 --ckpt $CK --world_sizes 1 --variants gsplat-dist ours-dense \
  --variant 'ours-dense-off=--cuda_graphs off' --steps 200 --warmup 20 --phase_steps 5 --out $O/bench_f2
