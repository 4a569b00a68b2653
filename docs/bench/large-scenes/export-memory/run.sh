# Rank 0's peak memory while it writes the merged PLY of a W = 2 model, CPU ranks over gloo:
# 4m/ on the project's 2-core CPU machine (at 891d844), 20m/ on the H200 machine's host (128 GiB,
# at f9f355b). Each folder: export_memory.txt (the script's output) and each rank's JSON.
python3 export_memory.py 4000000 4m
python3 export_memory.py 20000000 20m
