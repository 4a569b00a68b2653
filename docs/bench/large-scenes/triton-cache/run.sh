# Triton's cache after one device call on one H200, from an empty cache, with kernels/projection.py
# as a6245d3 left it (the alignment fix; unchanged since), the first device call of the graphed
# distributed step (before fb05910 was committed): the call
# ran first_use_train_f4.log (juicebox f4, 7,000 steps of the default preset: its captures include
# every first compilation, "cuda graphs: 68 captures in 22.46 s"), then the NCCL loopback GPU tests
# (SH degree 1) and the loopback benches (from the trained checkpoint and the 2 M scene, degree 3).
# cache_listing.txt: each compiled kernel's metadata file (<hash>/<kernel>.json), the group files
# left out: 7 variants each of _forward_kernel and _backward_kernel over all of that.
J=${J:-../shared/data/juicebox}
splat-train default --data_dir $J --data_factor 4 --max_steps 7000 --save_steps 7000 --result_dir /tmp/jb4 > first_use_train_f4.log 2>&1
ls $TRITON_CACHE_DIR/*/*.json | grep -v __grp__ > cache_listing.txt
