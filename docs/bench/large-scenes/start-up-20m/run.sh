# 20 M synthetic Gaussians at 1920x1080 on one H200 (at bb4d666): the time from the trainer's
# construction to the end of its first step (bench.json `startup_s`), ms/iter and peak memory.
splat-train bench --synthetic_gaussians 20000000 --resolution 1920x1080 --num_cameras 4 --variants ours-dense --steps 3 --warmup 1 --out .
