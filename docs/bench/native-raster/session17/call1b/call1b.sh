# session 17, call 1b (call 1 cut to what fits the session's last minutes; no trained models) on one H200: the kernel in base 2 (log2 opacity and a log2(e)-scaled conic:
# alpha = min(0.999, 2^(log2 o - sigma log2 e)), one skip test, o folded into the backward's sums),
# the loss reduced by the kernel's last block, one zeroed buffer for the gradients, and the autograd
# function's scaling skipped on the device when the incoming gradient is 1 (kernels/grad_scale.py).
# First-use build (main's kernel 1baedb4 and variant v2 beside it); GPU tests; two trained juicebox
# f2 models (default 7,000 steps; bytesplat, pruned); kernel_ab.py (main vs this, same inputs,
# phases 1/2/3; v2 = the forward's pair loop without its break, unrolled by 4; v3 = four pairs per
# iteration by hand, the loop left with a goto); bench-raster (fused
# vs the fastest unfused) on both models and the 2 M synthetic image; whole iterations W = 1 on
# juicebox f2 and the 2 M scene. Everything it writes is packed into $OUT/call1.tar.gz.
set -o pipefail
O=/tmp/o1; mkdir -p $O
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
export BASE_PKG=$PWD/.gpu/base BASE_BUILD=/tmp/base_build VARIANTS="v2=$PWD/.gpu/v2,v3=$PWD/.gpu/v3"; mkdir -p $BASE_BUILD
AB="$PWD/docs/bench/native-raster/session17/kernel_ab.py"
( cd docs/bench/native-raster/session17 && python3 -c "
import kernel_ab; m, t = kernel_ab.load_base(); print('base build', round(t, 1), 's')
m, t = kernel_ab.load_base('v2', '$PWD/.gpu/v2'); print('v2 build', round(t, 1), 's')
m, t = kernel_ab.load_base('v3', '$PWD/.gpu/v3'); print('v3 build', round(t, 1), 's')" ) > $O/base_build.txt 2>&1 &
BB=$!
source .whl/gpu-prelude.sh > $O/prelude.txt 2>&1 || { cat $O/prelude.txt; exit 1; }
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done: $(tail -2 $O/prelude.txt | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt 2>&1
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
wait $NB; el "$(cat $O/native_build.txt | tr '\n' ' ')"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_fused_raster.py tests/test_grad_scale.py tests/test_gpu.py -k "fused or whole_step or grad_scale or kernel_matches" -p no:cacheprovider > $O/gpu_tests.log 2>&1
el "gpu tests rc=$? $(tail -1 $O/gpu_tests.log)"
wait $BB; el "$(tail -3 $O/base_build.txt | tr '\n' ' ')"
timeout 100 python3 $AB $O/ab_2m.json --synthetic_gaussians 2000000 --resolution 1600x1200 > $O/ab_2m.log 2>&1; el "ab 2m rc=$? $(head -3 $O/ab_2m.log | tr '\n' ' ')"
timeout 100 bash -c "$(declare -f ST); ST bench-raster --synthetic_gaussians 2000000 --resolution 1600x1200 --repeats 20 --warmup 3 --profile 5 --out $O/br_2m" > $O/br_2m.log 2>&1
el "bench-raster 2m rc=$?"
el done
tar -czf $OUT/call1b.tar.gz -C /tmp o1
