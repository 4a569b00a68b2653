# session 8, call 2 (call 1's runs failed: `timeout` cannot run a shell function): issue 19 image
# paths alone on the GPU, then issue 21's 15 quality runs at once with the two fixed GPU tests beside
set -o pipefail
source .gpu/setup.sh || exit 1
R=/tmp/r; mkdir -p $R/logs
J=.data/juicebox; NEW=$PWD/.gpu/new
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
timeout 90 $NEW default --data_dir $J --data_factor 2 --max_steps 200 --eval_steps 30000 --num_traj_frames 0 --result_dir $R/i19_warm > $R/logs/i19_warm.log 2>&1
el "warm: $(grep '^train loop' $R/logs/i19_warm.log)"
for rep in 1 2; do
  for v in device pinned streamed; do
    case $v in device) F="";; pinned) F="--device_images_share 0";; streamed) F="--device_images_share 0 --image_cache_gb 0.05";; esac
    timeout 80 $NEW default --data_dir $J --data_factor 2 --max_steps 2000 --eval_steps 30000 --save_steps 30000 --ply_steps 30000 --num_traj_frames 0 $F --result_dir $R/i19_${v}_$rep > $R/logs/i19_${v}_$rep.log 2>&1
    el "i19 $v rep $rep: $(grep -E '^images:|^train loop' $R/logs/i19_${v}_$rep.log | tr '\n' ' ')"
  done
done
( PYTHONPATH=/tmp/pp:$BASEPP timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rfs tests/test_densify_stats.py tests/test_gpu_gsplat_flags.py::test_masked_capture_trains_on_gpu > $R/logs/gpu_tests.log 2>&1; echo "rc=$?" >> $R/logs/gpu_tests.log ) &
RUN="--data_factor 4 --max_steps 7000 --eval_steps 7000 --save_steps 7000 --ply_steps 7000 --num_traj_frames 0"
pids=()
for seed in 1 2 3; do
  for v in default absgrad antialiased masked unmasked; do
    case $v in default) F="--data_dir $J";; absgrad) F="--data_dir $J --absgrad --grow_grad2d 0.0008";; antialiased) F="--data_dir $J --antialiased";;
      masked) F="--data_dir .data/painted";; unmasked) F="--data_dir .data/painted-unmasked";; esac
    timeout 360 $NEW default $RUN $F --seed $seed --result_dir $R/i21_${v}_s$seed > $R/logs/i21_${v}_s$seed.log 2>&1 &
    pids+=($!)
  done
done
wait "${pids[@]}"
for seed in 1 2 3; do for v in default absgrad antialiased masked unmasked; do
  el "i21 $v s$seed: $(grep -E '^train loop|test PSNR' $R/logs/i21_${v}_s$seed.log | tail -2 | sed 's/.*step 7000/step 7000/' | tr '\n' ' ')"
done; done
wait
el "gpu tests:"; grep -E "passed|failed|FAILED|Error|rc=" $R/logs/gpu_tests.log | tail -8
for run in $R/i21_default_s* $R/i21_masked_s* $R/i21_unmasked_s*; do
  PYTHONPATH=/tmp/pp:$BASEPP python3 -m splat_train.scripts.masked_capture score $run --step 7000 2>&1 | tail -1
done | tee $R/logs/masked_scores.txt
find $R -name "*.ply" -delete; rm -rf $R/*/ckpts $R/*/point_cloud $R/*/renders
tar -czf $OUT/call5.tar.gz -C $R .
el done
