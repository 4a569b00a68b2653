# The fused kernel against the unfused step, and whole W = 1 iterations, on one H200 at 81ee1e7.
# Outputs beside this script: native_build.txt, br_{default,bytesplat,2m}/bench_raster.{md,json},
# bench_{f2,2m}/bench.{md,json}. J: the juicebox capture (../shared/data/juicebox, with images_2/).
set -o pipefail
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}; O=${O:-out}; mkdir -p $R $O
# first use of the native kernel, then a second process loading the cached build
python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native build (first use):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" > $O/native_build.txt 2>&1
python3 -c "
import time; t=time.perf_counter()
from splat_train.kernels import native
m = native.load()
print('native load (second process, cached):', 'ok' if m is not None else native.LOAD_ERROR, round(time.perf_counter()-t, 1), 's')" >> $O/native_build.txt 2>&1
# the two juicebox f2 models (run side by side; the bytesplat run is docs/bench/bytesplat/stages)
splat-train default --data_dir $J --data_factor 2 --max_steps 7000 --eval_steps 7000 --save_steps 7000 --ply_steps 30000 --num_traj_frames 0 --result_dir $R/ck_default &
splat-train bytesplat --data_dir $J --data_factor 2 --steps_scaler 0.233334 --eval_steps 30000 --ply_steps 99999 --num_traj_frames 0 --result_dir $R/ck_bytesplat &
wait
CKD=$(ls $R/ck_default/ckpts/ckpt_*_rank0.pt | tail -1); CKB=$(ls $R/ck_bytesplat/ckpts/ckpt_*_rank0.pt | tail -1)
# rasterization + loss + backward of one image, alone on the GPU
splat-train bench-raster --data_dir $J --data_factor 2 --ckpt $CKD --repeats 20 --warmup 3 --profile 5 --out $O/br_default
splat-train bench-raster --data_dir $J --data_factor 2 --ckpt $CKB --repeats 20 --warmup 3 --profile 5 --out $O/br_bytesplat
splat-train bench-raster --synthetic_gaussians 2000000 --resolution 1600x1200 --repeats 20 --warmup 3 --profile 5 --out $O/br_2m
# whole training iterations, W = 1
splat-train bench --data_dir $J --data_factor 2 --ckpt $CKD --world_sizes 1 --variants gsplat-dist ours-dense ours-packed ours-packed-fused --variant 'ours-dense-fused=--raster fused' --steps 200 --warmup 40 --phase_steps 5 --out $O/bench_f2
splat-train bench --synthetic_gaussians 2000000 --resolution 1600x1200 --world_sizes 1 --variants gsplat-dist ours-dense ours-packed ours-packed-fused --variant 'ours-dense-fused=--raster fused' --steps 40 --warmup 10 --phase_steps 3 --out $O/bench_2m
