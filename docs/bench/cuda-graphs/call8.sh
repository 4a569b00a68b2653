# session 12, call 4 on one H200 (call 8 of the cuda-graphs series): call 7's first f4 run without
# graphs timed out (it shared the CPU with the native build); run it again, then the issue's own
# measure, a full-mode --profile window at steps 3,020-3,049 on juicebox f2, default and graphs off.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
R=/tmp/r; mkdir -p $R/logs
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P4="--data_dir $J --data_factor 4 --max_steps 7000 --eval_steps 7000 --ply_steps 30000 --num_traj_frames 0"
timeout 80 bash -c "$(declare -f ST); ST default $P4 --cuda_graphs off --result_dir $R/f4_off1" > $R/logs/f4_off1.log 2>&1
el "f4 off1 rc=$?: $(grep -a 'train loop' $R/logs/f4_off1.log | tail -1)"
el "  $(grep -a -o "step 7000: test PSNR [0-9.]* SSIM [0-9.]*" $R/logs/f4_off1.log | tail -1)"
P="--data_dir $J --data_factor 2 --max_steps 3050 --eval_steps 3050 --ply_steps 30000 --num_traj_frames 0 --profile --profile_start_step 3020 --profile_num_steps 30"
for v in "auto_full:" "off_full:--cuda_graphs off"; do
  name=${v%%:*}; flags=${v#*:}
  timeout 50 bash -c "$(declare -f ST); ST default $P $flags --result_dir $R/train_$name" > $R/logs/train_$name.log 2>&1
  el "train $name rc=$?: $(grep -a 'train loop' $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a -o "profile: .*host syncs" $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a "cuda graphs:" $R/logs/train_$name.log | tail -1)"
done
cp $OUT/timeline.txt $R/logs/
find $R -name "trace_rank*.json" -exec gzip -6 {} \;
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call8.tar.gz -C $R .
el done
# call 8b (the warm machine still held call 7's /tmp/r, so call 8's f4 run refused the folder: rc 2),
# run as one command after `source .whl/gpu-prelude.sh` and the /tmp/pp link:
#   python3 -c '...main...' default --data_dir .data/juicebox --data_factor 4 --max_steps 7000 \
#     --eval_steps 7000 --ply_steps 30000 --num_traj_frames 0 --cuda_graphs off --result_dir /tmp/r8/f4_off1b
