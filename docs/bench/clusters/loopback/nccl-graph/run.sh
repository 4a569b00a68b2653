# One H200, at 54f81d3 (the exchange's code as fb05910), Triton's and the extensions' caches warm:
# nccl_graph.py (its docstring says what it times; nccl_graph.json / .log), then the one-process
# whole-step GPU test after the graphed step's generalization (../gpu_tests_one_process.log).
python nccl_graph.py > nccl_graph.log 2>&1
python -m pytest -q -s -m gpu tests/test_gpu.py -k graphed_whole_step > ../gpu_tests_one_process.log 2>&1
