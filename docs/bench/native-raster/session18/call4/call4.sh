# session 18, call 4 on one H200: the GPU test suite with --raster auto the default (fused on a GPU);
# the steady-state synchronization test first, with its per-layout counts printed. Written to
# $OUT/o4.
set -o pipefail
O=$OUT/o4; mkdir -p $O  
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $O/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=32
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site
python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native build (first use):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" > $O/native_build.txt 2>&1 &
NB=$!
source .whl/gpu-prelude.sh > $O/prelude.txt 2>&1 || { cat $O/prelude.txt; exit 1; }
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done: $(tail -1 $O/prelude.txt)"
wait $NB; el "$(cat $O/native_build.txt | tr '\n' ' ')"
timeout 150 python3 -m pytest -q -s -m gpu tests/test_gpu.py -k steady_state -p no:cacheprovider > $O/steady_state.log 2>&1
el "steady state rc=$? $(grep -E 'host syncs' $O/steady_state.log | cut -c1-60 | tr '\n' ';') $(tail -1 $O/steady_state.log)"
timeout 280 python3 -m pytest -q -m gpu tests -k "not steady_state" -p no:cacheprovider > $O/gpu_suite.log 2>&1
el "gpu suite rc=$? $(tail -1 $O/gpu_suite.log)"
