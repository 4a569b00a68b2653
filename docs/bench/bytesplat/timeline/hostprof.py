"""The host's time in a training step: ``splat-train ARGS`` (a train command or ``bench``) under
cProfile; the raw stats go to OUT.txt.pstats and OUT.txt gets the functions called at least once
per step, by cumulative and own time per step in microseconds, then the project's functions called
less often (start-up, captures, evaluations) by their total time. A step is one call of
``Trainer.sh_degree_at`` (once per train_step; train_step's own record can be lost where the
bench's torch.profiler window takes over the profiling hook). cProfile slows Python-heavy code
and the figures include the start-up spread over the steps, so read the split, not the sum.

Usage: python hostprof.py OUT.txt ARGS...    or    python hostprof.py --summarize FILE.pstats OUT.txt
"""

import cProfile
import pstats
import sys


def summarize(stats: pstats.Stats) -> str:
    entries = stats.stats  # type: ignore[attr-defined]  # pstats' own table
    steps = sum(v[1] for k, v in entries.items() if k[2] == "sh_degree_at" and k[0].endswith("trainer/loop.py"))
    steps = max(steps, 1)
    rows = []
    for (file, line, name), (_cc, nc, tt, ct, _callers) in entries.items():
        if nc < 0.95 * steps:
            continue  # not called every step: start-up, captures, evaluation
        where = file.split("site-packages/")[-1].split("splat_train/")[-1]
        rows.append((ct / steps * 1e6, tt / steps * 1e6, nc / steps, f"{where}:{line}({name})"))
    out = [f"steps: {steps}; per step, in microseconds (cProfile's clock)"]
    for title, key in (("by cumulative time", 0), ("by own time", 1)):
        out.append(f"\n{title}\n  cum_us   own_us  calls/step  function")
        out += [f"{r[0]:8.1f} {r[1]:8.1f} {r[2]:10.2f}  {r[3]}" for r in sorted(rows, key=lambda r: -r[key])[:50]]
    rare = [  # the project's own functions called less often: start-up, captures, evaluations
        (ct * 1e3, nc, f"{file.split('splat_train/')[-1]}:{line}({name})")
        for (file, line, name), (_cc, nc, _tt, ct, _callers) in entries.items()
        if "splat_train/" in file and nc < 0.95 * steps
    ]
    out.append("\nthe project's functions called less than once a step, by cumulative time\n  cum_ms   calls  function")
    out += [f"{r[0]:8.1f} {r[1]:7d}  {r[2]}" for r in sorted(rare, key=lambda r: -r[0])[:40]]
    return "\n".join(out) + "\n"


def main() -> int:
    if sys.argv[1] == "--summarize":
        open(sys.argv[3], "w").write(summarize(pstats.Stats(sys.argv[2])))
        return 0
    out_path, argv = sys.argv[1], sys.argv[2:]
    from splat_train.trainer import cli

    prof = cProfile.Profile()
    rc = prof.runcall(cli.main, argv)
    prof.dump_stats(out_path + ".pstats")
    text = summarize(pstats.Stats(prof))
    open(out_path, "w").write(text)
    print(text[:6000])
    return rc


if __name__ == "__main__":
    sys.exit(main())
