# The trainer's start-up at 20 M synthetic Gaussians (1080x1080, 40 cameras) on one H200, at
# a72f2b2 (the synthetic ground truth rendered on the GPU), under cProfile: train.log (the run's
# lines), cprofile_top.txt (the 45 largest cumulative entries).
python -m cProfile -o startup.prof -m splat_train.trainer.cli default --synthetic_num_gaussians 20000000 --synthetic_image_size 1080 --max_steps 3 --no_save_ply --disable_video --result_dir /tmp/r20 > train.log 2>&1
python -c "import pstats; pstats.Stats('startup.prof').sort_stats('cumulative').print_stats(45)" > cprofile_top.txt
