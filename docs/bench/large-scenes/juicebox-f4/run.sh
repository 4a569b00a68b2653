# juicebox f4 (images_4/), 7,000 steps of the default preset, this tree ("head", commit.txt) beside
# 22b3dbb ("base", the tree before the large-scene work: `git archive --prefix=splat_train/ 22b3dbb |
# gzip` as .whl/base-22b3dbb.tar.gz), seeds 42-44 alternating, after a 3,100-step warm-up run of each
# (Triton's cache then holds the projection at every SH degree), each with its own native-extension
# cache; one device call (gpu.txt). juicebox's images_4/, sparse/ and poses_bounds.npy copied into the
# ignored .data/juicebox and carried (../shared does not travel). Outputs: juicebox-<tree>-<seed>/
# train.log and stats/, timeline.txt. Run from the repository root.
source .whl/gpu-prelude.sh || exit 1
mkdir -p /tmp/pkg && ln -sfn $PWD /tmp/pkg/splat_train && export PYTHONPATH=/tmp/pkg:$PYTHONPATH
W=/tmp/w; R=$W/juicebox; mkdir -p $R; nvidia-smi > $W/gpu.txt 2>&1; echo ${COMMIT:-32271a1} > $W/commit.txt; T0=$(date +%s)
left() { echo $(( ${BUDGET:-330} - ($(date +%s) - T0) )); }
pack() { tar -czf $OUT/w.tar.gz -C /tmp w; }
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $R/timeline.txt; }
J=.data/juicebox
mkdir -p /tmp/base && tar -xzf .whl/base-22b3dbb.tar.gz -C /tmp/base || exit 1
FLAGS="--data_dir $J --data_factor 4 --max_steps 7000 --eval_steps 7000 --ply_steps 99999 --num_traj_frames 0 --no_save_ply"
train() {
  local commit=$1 seed=$2 steps=$3 out=$4; shift 4
  local path=$PYTHONPATH; [ $commit = base ] && path=/tmp/base:$PYTHONPATH
  mkdir -p $out
  PYTHONPATH=$path SPLAT_TRAIN_CACHE=/tmp/cache_$commit timeout $(( $(left) - 3 )) python3 -m splat_train.trainer.cli default \
    $FLAGS --seed $seed --max_steps $steps --result_dir /tmp/j/$commit$seed "$@" > $out/train.log 2>&1
}
for commit in base head; do
  train $commit 7 ${WARM_STEPS:-3100} $R/juicebox-warm-$commit --eval_steps 99999
  stamp "warm $commit rc=$?"
done
pack
for seed in ${SEEDS:-42 43 44}; do
  for commit in base head; do
    [ $(left) -lt 40 ] && break 2
    train $commit $seed 7000 $R/juicebox-$commit-$seed
    rc=$?; cp -r /tmp/j/$commit$seed/stats $R/juicebox-$commit-$seed/ 2>/dev/null
    stamp "juicebox $commit $seed rc=$rc $(tr '\r' '\n' < $R/juicebox-$commit-$seed/train.log | grep 'train loop:\|step 7000: test' | tr '\n' ';' | cut -c1-300)"
    pack
  done
done
