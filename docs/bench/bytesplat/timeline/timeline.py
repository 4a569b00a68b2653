"""Where a training run's wall time goes: runs ``splat-train ARGS`` in this process with a clock on
every console line (milliseconds since this script started) and on every train step, pruning stage
and output write, then writes OUT.json and prints its summary: the train loop by kind of step (replays,
captures, densification steps), the median replay by model size, and the writes and pruning
stages between steps.

A step's interval is the host's time from one ``train_step`` call to the next; each step
synchronizes once with the device (the tile intersection's count), so the intervals add up to the
loop's wall time within one step of device work. Usage: python timeline.py OUT.json ARGS...
"""

import json
import sys
import time

T0 = time.perf_counter()


class Stamped:
    """stdout with each line prefixed by the milliseconds since T0."""

    def __init__(self, stream):
        self.stream, self.fresh = stream, True

    def write(self, text):
        for part in text.splitlines(keepends=True):
            if self.fresh:
                self.stream.write(f"[{1000 * (time.perf_counter() - T0):9.0f} ms] ")
            self.stream.write(part)
            self.fresh = part.endswith("\n")
        return len(text)

    def flush(self):
        self.stream.flush()


def main() -> int:
    out_path, argv = sys.argv[1], sys.argv[2:]
    sys.stdout = Stamped(sys.stdout)
    from splat_train.trainer import cli, loop, prune

    steps, events = [], []
    orig_step, orig_write, orig_stages = loop.Trainer.train_step, loop.Trainer.write_outputs, prune.run_stages

    def captures(trainer):
        fb = trainer.forward_backward
        head = fb.graphed_head.captures if fb.graphed_head is not None else 0
        whole = fb.graphed_step.captures if fb.graphed_step is not None else 0
        return head + whole

    def train_step(self, step):
        t, n, c = time.perf_counter(), int(self.params["means"].shape[0]), captures(self)
        out = orig_step(self, step)
        steps.append(dict(step=step, t_ms=1000 * (t - T0), n=n, n_after=int(self.params["means"].shape[0]),
                          captured=captures(self) - c))
        return out

    def write_outputs(self, step, **kw):
        t = time.perf_counter()
        written = orig_write(self, step, **kw)
        if written:
            events.append(dict(kind="write_outputs", step=step, ms=1000 * (time.perf_counter() - t)))
        return written

    def run_stages(shard, setup, trainset, testset, cfg, report, done):
        t = time.perf_counter()
        r = orig_stages(shard, setup, trainset, testset, cfg, report, done)
        ms = 1000 * (time.perf_counter() - t)
        if ms > 20:
            events.append(dict(kind="prune_stage", step=done, ms=ms))
        return r

    loop.Trainer.train_step, loop.Trainer.write_outputs, prune.run_stages = train_step, write_outputs, run_stages
    rc = cli.main(argv)
    end_ms = 1000 * (time.perf_counter() - T0)
    for a, b in zip(steps, steps[1:] + [None]):
        a["interval_ms"] = (b["t_ms"] if b else end_ms) - a["t_ms"]
    ev_ms = {}
    for e in events:  # what ran between a step and the next: not the step's own time
        ev_ms[e["step"] - 1] = ev_ms.get(e["step"] - 1, 0.0) + e["ms"]
    kinds = {}
    for s in steps[:-1]:
        own = s["interval_ms"] - ev_ms.get(s["step"], 0.0)
        if s["n_after"] != s["n"]:
            kind = "densification (the model changed in the step)"
        elif s["captured"]:
            kind = "capture (a new shape: the step captured its graphs)"
        else:
            kind = "replay"
        k = kinds.setdefault(kind, dict(steps=0, ms=0.0))
        k["steps"] += 1
        k["ms"] += own
    summary = dict(
        process_ms_to_first_step=steps[0]["t_ms"] if steps else None,
        loop_ms=(steps[-1]["t_ms"] - steps[0]["t_ms"]) if steps else None,
        process_end_ms=end_ms,
        by_kind=kinds,
        events=events,
    )
    # replay ms/step by model size (buckets of 100 k Gaussians)
    buckets = {}
    for s in steps[:-1]:
        if s["n_after"] == s["n"] and not s["captured"]:
            b = buckets.setdefault(s["n"] // 100_000, [])
            b.append(s["interval_ms"] - ev_ms.get(s["step"], 0.0))
    summary["replay_median_ms_by_100k"] = {
        f"{100 * k}-{100 * (k + 1)}k": dict(steps=len(v), median_ms=sorted(v)[len(v) // 2]) for k, v in sorted(buckets.items())
    }
    json.dump(summary, open(out_path, "w"), indent=1)
    sys.stdout.stream.write(json.dumps(summary, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
