"""Run a command and print its peak resident memory (the child's ru_maxrss), then exit with its
status:  python peak_rss.py OUT.json command args..."""

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

t0 = time.perf_counter()
rc = subprocess.call(sys.argv[2:])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # kB -> GiB
result = dict(command=sys.argv[2:], rc=rc, peak_rss_gib=peak, wall_s=time.perf_counter() - t0)
Path(sys.argv[1]).write_text(json.dumps(result, indent=2))
print(f"peak RSS {peak:.2f} GiB, exit {rc}, {result['wall_s']:.0f} s", flush=True)
sys.exit(rc)
