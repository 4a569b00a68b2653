# One H200, at 54f81d3 (the exchange's code as fb05910), Triton's and the extensions' caches warm:
# nccl_graph.py as it was at ff9702d (git show ff9702d:docs/bench/clusters/loopback/nccl-graph/nccl_graph.py;
# it timed fb05910's one graph per direction: pack, collective and join together; nccl_graph.json /
# .log are its output), then the one-process
# whole-step GPU test after the graphed step's generalization (../gpu_tests_one_process.log).
python nccl_graph.py > nccl_graph.log 2>&1  # the script now times the separated pieces; not yet run
python -m pytest -q -s -m gpu tests/test_gpu.py -k graphed_whole_step > ../gpu_tests_one_process.log 2>&1
