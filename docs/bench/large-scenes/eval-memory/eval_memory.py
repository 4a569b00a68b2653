"""Rank 0's memory during one evaluation, for whichever splat_train is importable (this code,
or the code of 2b260ce, whose evaluation gathered every render on rank 0, when its tree is first on
PYTHONPATH).

    python eval_memory.py OUT.json splat-train-flags...   # e.g. default --data_dir ... --eval_steps 0

Runs ``splat-train`` with the flags given. Around every evaluation (2b260ce: evaluate.run_eval;
this code: evaluate.Evaluation.run) it records the process's resident memory (VmRSS), resets
the kernel's peak-RSS mark (writing 5 to /proc/self/clear_refs, Linux >= 4.0) and reads it back
after (VmHWM), and the device's allocated memory before and at its peak. The evaluation's own
host memory is VmHWM after minus VmRSS before. With ``--eval_steps 0`` the first evaluation is of
the initial model; the process writes OUT.json and ends right after it (no training, no checkpoint
or PLY of a 20 M-Gaussian model to write)."""

import json
import os
import sys
from pathlib import Path

import torch


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 2**20  # kB -> GiB
    raise KeyError(key)


def _measured(run, records):
    def wrapper(*args, **kwargs):
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            dev_before = torch.cuda.memory_allocated() / 2**30
        Path("/proc/self/clear_refs").write_text("5")
        rss_before = _status("VmRSS")
        out = run(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        records.append(
            dict(
                rss_before_gib=rss_before,
                rss_peak_gib=_status("VmHWM"),
                eval_host_gib=_status("VmHWM") - rss_before,
                device_before_gib=dev_before if cuda else None,
                device_peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                num_views=(out or {}).get("num_views"),
                num_gaussians=(out or {}).get("num_gaussians"),
                psnr=(out or {}).get("psnr"),
            )
        )
        print("eval memory:", json.dumps(records[-1]), flush=True)
        Path(out_json).write_text(json.dumps(dict(code=code, flags=flags, evaluations=records), indent=2))
        os._exit(0)

    return wrapper


out_json, flags = sys.argv[1], sys.argv[2:]
code = ""

if __name__ == "__main__":
    from splat_train.trainer import evaluate
    from splat_train.trainer.cli import main

    records: list = []
    if hasattr(evaluate, "Evaluation"):
        evaluate.Evaluation.run = _measured(evaluate.Evaluation.run, records)
        code = "this"
    else:
        evaluate.run_eval = _measured(evaluate.run_eval, records)
        code = "2b260ce"
    rc = main(flags)
    print(f"splat-train ended (exit {rc}) without an evaluation: give --eval_steps 0", file=sys.stderr)
    sys.exit(rc or 1)
