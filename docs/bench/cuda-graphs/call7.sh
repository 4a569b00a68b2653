# session 12, call 3 on one H200 (call 7 of the cuda-graphs series), main with --cuda_graphs auto as
# the default: juicebox f4 7,000-step default trainings, graphs off / default interleaved, 3 runs
# each (speed and test PSNR); bench W = 1 on juicebox f2 from a 3,050-step checkpoint and on the 2 M
# synthetic scene at 1600x1200, gsplat-dist against ours with and without graphs.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
( python3 -c "
from splat_train.kernels import native
print('native:', 'ok' if native.load() is not None else native.LOAD_ERROR)" > /tmp/native_build.txt 2>&1 ) &
NB=$!
R=/tmp/r; mkdir -p $R/logs
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P4="--data_dir $J --data_factor 4 --max_steps 7000 --eval_steps 7000 --ply_steps 30000 --num_traj_frames 0"
for v in "off1:--cuda_graphs off" "auto1:" "off2:--cuda_graphs off" "auto2:" "off3:--cuda_graphs off" "auto3:"; do
  name=${v%%:*}; flags=${v#*:}
  timeout 70 bash -c "$(declare -f ST); ST default $P4 $flags --result_dir $R/f4_$name" > $R/logs/f4_$name.log 2>&1
  el "f4 $name rc=$?: $(grep -a 'train loop' $R/logs/f4_$name.log | tail -1)"
  el "  $(grep -a "cuda graphs:" $R/logs/f4_$name.log | tail -1) $(grep -a -o "step 7000: test PSNR [0-9.]* SSIM [0-9.]*" $R/logs/f4_$name.log | tail -1)"
done
timeout 40 bash -c "$(declare -f ST); ST default --data_dir $J --data_factor 2 --max_steps 3050 --eval_steps 3050 --ply_steps 30000 --num_traj_frames 0 --result_dir $R/f2_ckpt" > $R/logs/f2_ckpt.log 2>&1
el "f2 checkpoint rc=$?: $(grep -a 'train loop' $R/logs/f2_ckpt.log | tail -1)"
wait $NB; el "$(cat /tmp/native_build.txt | tail -1)"
ck=$(ls $R/f2_ckpt/ckpts/ckpt_*_rank0.pt 2>/dev/null | tail -1)
timeout 120 bash -c "$(declare -f ST); ST bench --data_dir $J --data_factor 2 --ckpt $ck --world_sizes 1 --variants gsplat-dist ours-dense --variant 'ours-dense-off=--cuda_graphs off' --variant 'ours-dense-fused=--raster fused' --variant 'ours-dense-fused-off=--raster fused --cuda_graphs off' --steps 200 --warmup 20 --phase_steps 5 --out $R/bench_f2" > $R/logs/bench_f2.log 2>&1
el "bench f2 rc=$?"; grep -a "^| " $R/logs/bench_f2.log | cut -c1-80
timeout 150 bash -c "$(declare -f ST); ST bench --synthetic_gaussians 2000000 --resolution 1600x1200 --num_cameras 10 --world_sizes 1 --variants gsplat-dist ours-dense --variant 'ours-dense-off=--cuda_graphs off' --steps 40 --warmup 10 --phase_steps 5 --out $R/bench_2m" > $R/logs/bench_2m.log 2>&1
el "bench 2m rc=$?"; grep -a "^| " $R/logs/bench_2m.log | cut -c1-80
cp $OUT/timeline.txt $R/logs/
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call7.tar.gz -C $R .
el done
