# session 8, call 1: issue 19 image paths (alone), then issue 21 quality waves with the GPU tests and
# the 20 M export-memory script beside them
set -o pipefail
source .gpu/setup.sh || exit 1
R=/tmp/r; mkdir -p $R/logs
J=.data/juicebox
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
# --- issue 19: the three image paths on juicebox f2, alone on the GPU, ABCABC after a warm-up run
new default --data_dir $J --data_factor 2 --max_steps 200 --eval_steps 30000 --num_traj_frames 0 --result_dir $R/i19_warm > $R/logs/i19_warm.log 2>&1
for rep in 1 2; do
  for v in device pinned streamed; do
    case $v in device) F="";; pinned) F="--device_images_share 0";; streamed) F="--device_images_share 0 --image_cache_gb 0.05";; esac
    timeout 100 new default --data_dir $J --data_factor 2 --max_steps 2000 --eval_steps 30000 --save_steps 30000 --ply_steps 30000 --num_traj_frames 0 $F --result_dir $R/i19_${v}_$rep > $R/logs/i19_${v}_$rep.log 2>&1
    el "i19 $v rep $rep: $(grep -E '^images:|^train loop' $R/logs/i19_${v}_$rep.log | tr '\n' ' ')"
  done
done
# --- GPU tests in the background
( PYTHONPATH=/tmp/pp:$BASEPP timeout 330 python3 -m pytest -m gpu tests -q -p no:cacheprovider -rfs > $R/logs/gpu_tests.log 2>&1; echo "rc=$?" >> $R/logs/gpu_tests.log ) &
TESTS=$!
# --- issue 21: waves of 5 concurrent 7,000-step runs (one seed each)
RUN="--data_factor 4 --max_steps 7000 --eval_steps 7000 --save_steps 7000 --ply_steps 7000 --num_traj_frames 0"
for seed in 1 2 3; do
  [ $seed = 2 ] && ( timeout 200 env PYTHONPATH=/tmp/pp:$BASEPP nice python3 docs/bench/large-scenes-cpu/export_memory.py 20000000 /tmp/expmem > $R/logs/export_memory_20m.log 2>&1; cp /tmp/expmem/*.json $R/logs/ 2>/dev/null ) &
  pids=()
  for v in default absgrad antialiased masked unmasked; do
    case $v in default) F="--data_dir $J";; absgrad) F="--data_dir $J --absgrad --grow_grad2d 0.0008";; antialiased) F="--data_dir $J --antialiased";;
      masked) F="--data_dir .data/painted";; unmasked) F="--data_dir .data/painted-unmasked";; esac
    timeout 175 new default $RUN $F --seed $seed --result_dir $R/i21_${v}_s$seed > $R/logs/i21_${v}_s$seed.log 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  for v in default absgrad antialiased masked unmasked; do
    el "i21 $v s$seed: $(grep -E '^train loop|test PSNR' $R/logs/i21_${v}_s$seed.log | tail -2 | tr '\n' ' ')"
  done
done
wait
el "gpu tests:"; grep -E "passed|failed|FAILED|Error|rc=" $R/logs/gpu_tests.log | tail -25
cat $R/logs/export_memory_20m.log | tail -5
for run in $R/i21_default_s* $R/i21_masked_s* $R/i21_unmasked_s*; do
  PYTHONPATH=/tmp/pp:$BASEPP python3 -m splat_train.scripts.masked_capture score $run --step 7000 2>&1 | tail -1
done | tee $R/logs/masked_scores.txt
rm -rf /tmp/expmem; find $R -name "*.ply" -delete; rm -rf $R/*/ckpts $R/*/point_cloud $R/i21_*/renders $R/i19_*/renders
tar -czf $OUT/call4.tar.gz -C $R .
ls -la $OUT; el done
