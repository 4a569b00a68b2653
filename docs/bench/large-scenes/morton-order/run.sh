# The fused kernel against the Gaussians' order in memory and the tiles' order in the launch, at
# 20 M all visible, 1920x1080, one camera: order.py's timings (order_orbit.json, order.log), then
# one fused call per Gaussian order under Nsight Compute (ncu.txt: DRAM bytes, L2 hit rate,
# occupancy). The step with and without --morton_order is a variant of ../show/run.sh
# (EXTRA='--variant "ours-dense-fused-input-order=--raster fused --no_morton_order"').
# Run from the repository root after `source .whl/gpu-prelude.sh`; R: where the outputs go.
R=${R:-$OUT/r}; mkdir -p $R; t0=$(date +%s); D=docs/bench/large-scenes/morton-order
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $R/timeline.txt; }
nvidia-smi > $R/gpu.txt 2>&1
python3 $D/order.py time 20000000 1920x1080 orbit $R ${NCU:+save} > $R/order.log 2>&1
stamp "order rc=$? $(grep -h '^orig\|^morton' $R/order.log | tr '\n' ';')"
if [ -n "$NCU" ]; then
  ncu --clock-control none --kernel-name regex:fused_raster_loss --launch-skip 2 --launch-count 4 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_op_atom.sum \
    python3 $D/order.py ncu 0 0 orbit $R > $R/ncu.txt 2>&1
  stamp "ncu rc=$?"; rm -f $R/inputs_*.pt
fi
