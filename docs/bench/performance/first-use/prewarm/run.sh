# The first run on a machine (an empty Triton cache) with the projection's higher SH degrees
# compiled in the background (kernels/prewarm.py) against the same run without
# (SPLAT_TRAIN_PREWARM=0): juicebox f4, 7,000 steps of the default preset, seed 42, alternating
# off, on, on, off, each run with its own empty TRITON_CACHE_DIR (the native kernel's build cached
# by a short run first, so only Triton compiles). train_<mode>_<i>.log: the console, with
# bash's `time` (wall, user and system seconds) at its end. First the GPU tests of kernels/prewarm.py.
# Run from the repository root after `source .whl/gpu-prelude.sh`; R: where the outputs go;
# J: juicebox (on the device machine a copy carried in the ignored .data/).
R=${R:-$OUT/r}; mkdir -p $R; t0=$(date +%s); TIMEFORMAT='wall %R s, user %U s, sys %S s'
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $R/timeline.txt; }
nvidia-smi > $R/gpu.txt 2>&1
python3 -m pytest -q -m gpu tests/test_prewarm.py > $R/gpu_tests.log 2>&1
stamp "tests rc=$? $(tail -1 $R/gpu_tests.log)"
J=${J:-$([ -d .data/juicebox ] && echo .data/juicebox || echo ../shared/data/juicebox)}
export SPLAT_TRAIN_CACHE=/tmp/splat_cache
FLAGS="--data_dir $J --data_factor 4 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply --seed 42"
TRITON_CACHE_DIR=/tmp/triton_build python3 -m splat_train.trainer.cli default $FLAGS --max_steps 50 --eval_steps 99999 \
  --result_dir /tmp/pw/build > $R/build.log 2>&1
stamp "native build rc=$?"
i=0
for mode in off on on off; do
  i=$((i + 1)); rm -rf /tmp/pw/$i
  flag=1; [ $mode = off ] && flag=0
  { time SPLAT_TRAIN_PREWARM=$flag TRITON_CACHE_DIR=/tmp/triton_$i \
    python3 -m splat_train.trainer.cli default $FLAGS --max_steps 7000 --result_dir /tmp/pw/$i > $R/train_${mode}_$i.log 2>&1 ; } \
    2>> $R/train_${mode}_$i.log
  stamp "run $i prewarm $mode rc=$? $(tr '\r' '\n' < $R/train_${mode}_$i.log | grep -h 'train loop:\|cuda graphs:\|test PSNR\|^wall' | tr '\n' ';' | cut -c1-600)"
done
