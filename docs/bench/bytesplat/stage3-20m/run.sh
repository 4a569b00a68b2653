# What ByteSplat's stage 3 buys on the large-scenes issue's 20 M scenes (city-like and all
# visible, 1920x1080, 16 cameras): the bytesplat preset trains each scene's initial model for a short
# schedule (STEPS, densification off, stage 2 at STAGE2, stage 3 at STAGE3) and a stage-2-only
# control (--prune_stage3_step 0) the same; then from each run's final checkpoint the fused
# kernel's GPU time per image (bench-raster, the first VIEWS training views) and whole W = 1
# iterations of the default step (bench, ours-dense-fused).
# Outputs, for each scene s and run m in {stage3, stage2only}: <s>/<m>/train.log,
# <s>/<m>/stats/*.json (prune_stage<k>.json: Gaussians before and after, tiles within the budget,
# seconds), <s>/br_<m>/bench_raster.{json,md}, <s>/bench_<m>/bench.{json,md}; timeline.txt.
# Run from the repository root (after `source .whl/gpu-prelude.sh` on the GPU machine); R: where the
# outputs go; SCENES (default "city-20m 20m"); N, RES (WxH), STEPS, STAGE2, STAGE3, VIEWS scale it
# down (a CPU check: N=20000 RES=192x108 STEPS=30 STAGE2=10 STAGE3=20 VIEWS=2).
R=${R:-$OUT/r}; mkdir -p $R; t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $R/timeline.txt; }
N=${N:-20000000}; RES=${RES:-1920x1080}; STEPS=${STEPS:-600}; STAGE2=${STAGE2:-300}; STAGE3=${STAGE3:-450}
VIEWS=${VIEWS:-4}; W=${RES%x*}; H=${RES#*x}
for scene in ${SCENES-city-20m 20m}; do
  layout=orbit; [ $scene = city-20m ] && layout=city
  S=$R/$scene; mkdir -p $S
  for m in stage3 stage2only; do
    s3=$STAGE3; [ $m = stage2only ] && s3=0
    mkdir -p $S/$m
    splat-train bytesplat --synthetic_layout $layout --synthetic_num_gaussians $N --synthetic_num_cameras 16 \
      --synthetic_image_size $W --synthetic_image_height $H --max_steps $STEPS --refine_start_iter $((STEPS + 1)) \
      --refine_stop_iter $STAGE2 --prune_stage2_step $STAGE2 --prune_stage3_step $s3 --eval_steps $STEPS \
      --save_steps $STEPS --ply_steps 99999 --no_save_ply --num_traj_frames 0 --no_save_eval_images \
      --result_dir $S/$m > $S/$m/train.log 2>&1
    stamp "$scene $m train rc=$? $(grep -h 'train loop' $S/$m/train.log)"
    ck=$S/$m/ckpts/ckpt_${STEPS}_rank0.pt
    scene_args=(--synthetic_layout $layout --synthetic_gaussians $N --resolution $RES --num_cameras 16 --ckpt $ck)
    splat-train bench-raster "${scene_args[@]}" --batch_size $VIEWS --views $(seq 0 $((VIEWS - 1))) --profile 5 --out $S/br_$m \
      > $S/br_$m.log 2>&1
    stamp "$scene $m bench-raster rc=$? $(grep -h 'fused' $S/br_$m.log | tail -2 | tr '\n' ';')"
    splat-train bench "${scene_args[@]}" --variants ours-dense-fused --world_sizes 1 --steps 40 --warmup 10 \
      --phase_steps 3 --profile_steps 5 --out $S/bench_$m > $S/bench_$m.log 2>&1
    stamp "$scene $m bench rc=$? $(grep -h 'ms/iter' $S/bench_$m.log | head -1)"
    rm -rf $S/$m/ckpts $S/$m/tb
  done
done
