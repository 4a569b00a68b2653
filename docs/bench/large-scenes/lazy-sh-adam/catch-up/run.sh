# The catch-up kernel probed (probe.py) on the city 20 M: the default step with graphs off, 24 steps,
# each launch of the catch-up summarised and timed on copies of its state, as it is and with eps = 0.
# Run from the repository root of a checkout of 4806135 (probe.py's docstring) after
# `source .whl/gpu-prelude.sh`; R: where the outputs go. Output: probe/ (probe.json, console.log,
# bench.md of the bench invocation, which ran every default variant: `--variants` was then given
# no name; the records of the three graphs-off / graphs-on runs agree).
R=${R:-$OUT/r}; mkdir -p $R/probe
SPLAT_CATCH_UP=masked python3 docs/bench/large-scenes/lazy-sh-adam/catch-up/probe.py $R/probe/probe.json -- \
  --synthetic_layout city --synthetic_gaussians 20000000 --resolution 1920x1080 --variants probe \
  --variant "probe=--raster fused --lazy_sh_adam on --cuda_graphs off" \
  --steps 24 --warmup 4 --phase_steps 3 --world_sizes 1 --out $R/probe > $R/probe/console.log 2>&1
echo "probe rc=$? $(grep -c '^probe:' $R/probe/console.log) launches"
