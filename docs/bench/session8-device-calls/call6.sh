# session 8, call 3: issue 19's image paths again (decode threads now copy into pinned memory with
# numpy), then issue 21's masked capture with the moving rectangle (9 runs at once)
set -o pipefail
source .gpu/setup.sh || exit 1
R=/tmp/r; mkdir -p $R/logs
J=.data/juicebox; NEW=$PWD/.gpu/new
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
timeout 90 $NEW default --data_dir $J --data_factor 2 --max_steps 200 --eval_steps 30000 --num_traj_frames 0 --result_dir $R/i19_warm > $R/logs/i19_warm.log 2>&1
el "warm: $(grep '^train loop' $R/logs/i19_warm.log)"
for rep in 1 2; do
  for v in pinned streamed; do
    case $v in device) F="";; pinned) F="--device_images_share 0";; streamed) F="--device_images_share 0 --image_cache_gb 0.05";; esac
    timeout 80 $NEW default --data_dir $J --data_factor 2 --max_steps 2000 --eval_steps 30000 --save_steps 30000 --ply_steps 30000 --num_traj_frames 0 $F --result_dir $R/i19_${v}_$rep > $R/logs/i19_${v}_$rep.log 2>&1
    el "i19 $v rep $rep: $(grep -E '^train loop' $R/logs/i19_${v}_$rep.log | tr '\n' ' ')"
  done
done
RUN="--data_factor 4 --max_steps 7000 --eval_steps 7000 --save_steps 7000 --ply_steps 7000 --num_traj_frames 0"
pids=()
for seed in 1 2; do
  for v in default masked unmasked; do
    case $v in default) F="--data_dir $J";; masked) F="--data_dir .data/painted-moving";; unmasked) F="--data_dir .data/painted-moving-unmasked";; esac
    timeout 200 $NEW default $RUN $F --seed $seed --result_dir $R/i21m_${v}_s$seed > $R/logs/i21m_${v}_s$seed.log 2>&1 &
    pids+=($!)
  done
done
wait "${pids[@]}"
for run in $R/i21m_*; do
  PYTHONPATH=/tmp/pp:$BASEPP python3 -m splat_train.scripts.masked_capture score $run --step 7000 --moving 2>&1 | tail -1
done | tee $R/logs/masked_moving_scores.txt
grep -h "^train loop" $R/logs/i21m_*.log
find $R -name "*.ply" -delete; rm -rf $R/*/ckpts $R/*/point_cloud $R/*/renders $R/*/tb
tar -czf $OUT/call6.tar.gz -C $R .
el done
