# Where a juicebox f2 run of 7,000 steps spends its wall time, on one H200 (two device calls, each
# on its own machine: their hosts differ, so compare runs within a call only).
# before-fixes/ (at 2a68af0, Triton's cache restored from an earlier call): import times
# (python -X importtime), a warm-up preset run, then the default and bytesplat presets (seed 1)
# through timeline.py, then from each run's final checkpoint a bench of the fused step with a
# profile window (GPU-busy share) -- bench_<preset>/.
# after-lpips-fix/ (at 9b5a4b0): what the first evaluation used to pay to import torchmetrics
# (lpips_probe.txt), the host's time per step of a 64 k-Gaussian 960x540 bench under cProfile
# (hostprof_bench64k.txt) and of a 50-step preset run (hostprof_start.txt), and the bytesplat preset
# (seed 1) through timeline.py.
J=${J:-../shared/data/juicebox}; T=$(dirname "$0"); R=${R:-/tmp}
COMMON="--data_dir $J --data_factor 2 --steps_scaler 0.233334 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply --seed 1"
B=${B:-before-fixes}; mkdir -p $B
python -X importtime -c "import splat_train.trainer.cli, splat_train.trainer.loop" 2> $R/importtime.txt
awk -F'|' 'NR>1 && $2+0 > 100000' $R/importtime.txt > $B/importtime_top.txt
python $T/timeline.py $B/warm_bytesplat.timeline.json bytesplat $COMMON --result_dir $R/w > $B/warm_bytesplat.train.log 2>&1
for p in default bytesplat; do
  python $T/timeline.py $B/$p.timeline.json $p $COMMON --result_dir $R/$p > $B/$p.train.log 2>&1
  splat-train bench --data_dir $J --data_factor 2 --ckpt $R/$p/ckpts/ckpt_7000_rank0.pt --variants ours-dense-fused \
    --world_sizes 1 --steps 400 --warmup 100 --phase_steps 5 --profile_steps 10 --out $B/bench_$p > $B/bench_$p/console.log 2>&1
done
A=${A:-after-lpips-fix}; mkdir -p $A/bench64k
python -c "
import time, importlib; import torch
t = time.perf_counter(); importlib.import_module('torchmetrics'); print(f'import torchmetrics (what the first evaluation paid before): {time.perf_counter() - t:.2f} s')" > $A/lpips_probe.txt 2>&1
python -c "
import time; import torch; from splat_train.trainer import metrics
t = time.perf_counter(); m = metrics.LPIPSMetric(); print(f'LPIPSMetric() now: {time.perf_counter() - t:.3f} s; {m.reason}')" >> $A/lpips_probe.txt 2>&1
python $T/hostprof.py $A/hostprof_bench64k.txt bench --synthetic_gaussians 64000 --resolution 960x540 --variants ours-dense-fused \
  --world_sizes 1 --steps 2000 --warmup 100 --phase_steps 2 --out $A/bench64k > $A/bench64k/console.log 2>&1
python $T/hostprof.py $A/hostprof_start.txt bytesplat --data_dir $J --data_factor 2 --max_steps 50 --eval_steps 50 --ply_steps 99999 \
  --no_save_ply --num_traj_frames 0 --result_dir $R/s > /dev/null 2>&1
python $T/timeline.py $A/bytesplat.timeline.json bytesplat $COMMON --result_dir $R/b > $A/bytesplat.train.log 2>&1
