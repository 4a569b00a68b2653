# session 18, call 5 (prepared, not yet run: this session's device time ran out) on one H200:
# issue 16's item 4, whether pruning stage 3 still buys speed now that the native kernel has no
# per-tile budget cliff. Two bytesplat runs on juicebox f2 (7,000 steps, seed 1) trained side by
# side: the preset (stage 2 at 3,500, stage 3 at 4,666) and a stage-2-only control
# (--prune_stage3_step 0); then, on the idle GPU, from each run's final checkpoint: bench-raster
# (fused vs unfused, kernel time) and whole W = 1 iterations (ours-dense-fused, ours-dense).
# Written to $OUT/o5 as it goes.
set -o pipefail
O=$OUT/o5; mkdir -p $O
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $O/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=32
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site
source .whl/gpu-prelude.sh > $O/prelude.txt 2>&1 || { cat $O/prelude.txt; exit 1; }
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done: $(tail -1 $O/prelude.txt)"
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
python3 -c "from splat_train.kernels import native; print('native build:', 'ok' if native.load() is not None else native.LOAD_ERROR)" > $O/native_build.txt 2>&1
el "$(cat $O/native_build.txt)"
J=.data/juicebox; R=/tmp/r; mkdir -p $R
RUN="--data_dir $J --data_factor 2 --steps_scaler 0.233334 --seed 1 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0"
timeout 300 bash -c "$(declare -f ST); ST bytesplat $RUN --result_dir $R/stage3" > $O/train_stage3.log 2>&1 &
P1=$!
timeout 300 bash -c "$(declare -f ST); ST bytesplat $RUN --prune_stage3_step 0 --result_dir $R/stage2only" > $O/train_stage2only.log 2>&1 &
P2=$!
wait $P1 $P2
el "training done: $(grep -ho 'prune stage [23] after step [0-9]*: [0-9,]* of [0-9,]* Gaussians removed; tiles within budget [0-9]*: [0-9.%]* -> [0-9.%]*' $O/train_*.log | tr '\n' ';')"
for v in stage3 stage2only; do
  mkdir -p $O/train_$v && cp -r $R/$v/stats $R/$v/cfg.yml $O/train_$v/
  ck=$(ls $R/$v/ckpts/ckpt_*_rank0.pt | tail -1)
  timeout 90 bash -c "$(declare -f ST); ST bench-raster --data_dir $J --data_factor 2 --ckpt $ck --repeats 20 --warmup 3 --profile 5 --out $O/br_$v" > $O/br_$v.log 2>&1
  el "bench-raster $v rc=$?"
  timeout 120 bash -c "$(declare -f ST); ST bench --data_dir $J --data_factor 2 --ckpt $ck --world_sizes 1 --variants ours-dense ours-dense-fused --steps 200 --warmup 40 --phase_steps 5 --out $O/bench_$v" > $O/bench_$v.log 2>&1
  el "bench $v rc=$?"
done
find $O -name "*.png" -delete
el done
