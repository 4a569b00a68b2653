# Rank 0's memory during one evaluation, on one H200 at d1d9964: a 2,000-frame capture made from
# juicebox (250 test views at 960x540), the initial model of --init_type random evaluated at step 0.
# eval_this_{20m,2m}.json: this code; eval_old_2m.json: 2b260ce (every test view's render and
# ground truth kept as float32 on rank 0), its tree first on PYTHONPATH.
set -o pipefail
J=${J:-../shared/data/juicebox}; R=${R:-/tmp/r}; mkdir -p $R
python3 -m splat_train.scripts.repeat_capture $J /tmp/jb2k --frames 2000 --data_factor 2
E="default --data_dir /tmp/jb2k --data_factor 2 --init_type random --max_steps 1 --eval_steps 0 --num_traj_frames 0 --no_save_eval_images"
python3 eval_memory.py eval_this_20m.json $E --init_num_pts 20000000 --result_dir $R/this20m
PYTHONPATH=/path/to/2b260ce-tree:$PYTHONPATH python3 eval_memory.py eval_old_2m.json $E --init_num_pts 2000000 --result_dir $R/old2m
python3 eval_memory.py eval_this_2m.json $E --init_num_pts 2000000 --result_dir $R/this2m
