# session 11, call 5 on one H200: graphs.GraphedHead on its own cycle-free capture (CapturedGraphs
# instead of torch.cuda.make_graphed_callables, whose superseded graphs waited for the garbage
# collector: peak 1.57 GiB in call 4): the GPU tests of the graphs and the sync counts, then juicebox
# f2 with a --profile window at steps 3,020-3,049, graphs then eager, one after the other.
set -o pipefail
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/timeline.txt; }
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/splat_train
export SPLAT_TRAIN_CACHE=/tmp/cache PYTHONUNBUFFERED=1
source .whl/gpu-prelude.sh || exit 1
export PYTHONPATH=/tmp/pp:$PYTHONPATH
el "prelude done"
R=/tmp/r; mkdir -p $R/logs
timeout 110 python3 -m pytest -q -m gpu tests/test_gpu.py -k "graph or superseded or refused or steady" -p no:cacheprovider > $R/logs/tests_graphs.log 2>&1
el "graph tests rc=$?: $(tail -1 $R/logs/tests_graphs.log)"
ST() { python3 -c 'import sys;from splat_train.trainer.cli import main;sys.exit(main(sys.argv[1:]))' "$@"; }
J=.data/juicebox
P="--data_dir $J --data_factor 2 --max_steps 3050 --eval_steps 3050 --ply_steps 30000 --num_traj_frames 0 --profile --profile_start_step 3020 --profile_num_steps 30"
for v in "graphs:--cuda_graphs" "eager:"; do
  name=${v%%:*}; flags=${v#*:}
  timeout 45 bash -c "$(declare -f ST); ST default $P $flags --result_dir $R/train_$name" > $R/logs/train_$name.log 2>&1
  el "train $name rc=$?: $(grep -a 'train loop' $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a -o "profile: .*host syncs" $R/logs/train_$name.log | tail -1)"
  el "  $(grep -a "cuda graphs:" $R/logs/train_$name.log | tail -1)"
  el "  its: $(grep -a -o 'its=[0-9.]*' $R/logs/train_$name.log | uniq | tail -12 | tr '\n' ' ')"
done
cp $OUT/timeline.txt $R/logs/
find $R -name "trace_rank*.json" -delete
rm -rf $R/*/ckpts $R/*/tb $R/*/ply $R/*/point_cloud $R/*/renders $R/*/videos
find $R -name "*.png" -delete
tar -czf $OUT/call5.tar.gz -C $R .
el done
