# The 20 M-Gaussian trainer's start-up on one H200 at fb05910 (the last part of the device call of
# ../../clusters/loopback/run.sh, Triton's cache warm from an earlier call, gsplat's and the native
# kernel's builds restored): 3 steps of the default preset on the synthetic scene at 1080x1080, run in
# one process under cProfile (.gpu-style wrapper: cProfile.Profile().runcall(cli.main, argv), stats
# sorted by cumulative then internal time in cli.prof.txt; the profiler sees the main thread only and
# inflates Python-heavy parts), each console line prefixed with the milliseconds since the start
# (console.log; the progress bar's lines arrive when the next newline does).
python -u profile_cli.py default --synthetic_num_gaussians 20000000 --synthetic_image_size 1080 --max_steps 3 \
  --eval_steps 99999 --ply_steps 99999 --no_save_ply --num_traj_frames 0 --result_dir $R/r20m > console.log
