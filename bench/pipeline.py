"""ddptui's input pipelines on a JPEG ImageFolder: img/s over the steady part of the run (from
the ranks' step events after `--warmup` steps, within epochs), data-wait, and where the limit is.

python bench/pipeline.py /data/jpeg --gpus 0,1 -- --decode gpu --workers 6
python bench/pipeline.py synthetic --gpus 0 -- --steps-per-epoch 300   (the same model, no input)
--model resnet50: another of the built-in models (resnet18 by default).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--gpus", default="0,1")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--model", default="resnet18")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = ap.parse_args(argv[:cut]), argv[cut + 1:]
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "run.jsonl")
        run = subprocess.run([sys.executable, "-m", "ddptui", "run", args.model, "--headless",
                              "--gpus", args.gpus, "--data", "synthetic" if args.root == "synthetic"
                              else f"imagefolder:{args.root}",
                              "--amp", "bf16", "--channels-last", "--batch-size",
                              str(args.batch_size), "--log", log, *extra],
                             cwd=tmp, capture_output=True, text=True)
        if not os.path.exists(log) or not any('"kind":"step"' in line for line in open(log)):
            outs = "".join(open(os.path.join(tmp, f)).read()[-1500:] for f in os.listdir(tmp)
                           if f.endswith(".out"))
            sys.exit(f"{' '.join(extra)}: no steps\n{run.stdout[-1500:]}{run.stderr[-1500:]}{outs}")
        evs = [json.loads(line) for line in open(log)]
    verdicts = [e for e in evs if e["kind"] == "message" and e.get("autotune")]
    since = verdicts[0]["t"] + 3 if verdicts else 0.0  # with --autotune: once it has chosen
    rate, across, waits, ends = 0.0, 0.0, [], {}
    for rank in sorted({e["rank"] for e in evs if e["kind"] == "step"}):
        steps = [e for e in evs if e["kind"] == "step" and e["rank"] == rank
                 and e["global_step"] >= args.warmup and e["t"] >= since]
        by_epoch: dict[int, list[dict]] = {}
        for e in steps:
            by_epoch.setdefault(e["epoch"], []).append(e)
        done = seconds = 0.0  # within each epoch: the validation between epochs is not input
        for within in by_epoch.values():
            done += within[-1]["global_step"] - within[0]["global_step"]
            seconds += within[-1]["t"] - within[0]["t"]
        rate += done * args.batch_size / seconds
        ends[rank] = epoch_ends(evs, by_epoch, rank, seconds / max(1, done))
        a, b = steps[0], steps[-1]  # across epochs: epoch ends and validation in
        across += (b["global_step"] - a["global_step"]) * args.batch_size / (b["t"] - a["t"])
        waits += [e["data_wait"] for e in steps[1:]]
    decoder = [e["decoder"] for e in evs if e["kind"] == "message" and e.get("decoder")]
    # The parent's NVML readings (as nvidia-smi's): the most any GPU of the run held.
    memory = max((e.get("mem_used") or 0 for e in evs if e["kind"] == "gpu"), default=None)
    print(json.dumps({"options": " ".join(extra), "img_s": round(rate), "gpu_mem_peak_mib": memory,
                      "img_s_across_epochs": round(across),
                      "decoder": decoder[0] if decoder else None,
                      "data_wait": round(sum(waits) / max(1, len(waits)), 3),
                      "epoch_ends_rank0": ends.get(0),
                      "autotune": verdicts[0]["text"] if verdicts else None}), flush=True)


def epoch_ends(evs: list[dict], by_epoch: dict[int, list[dict]], rank: int,
               step_s: float) -> list[dict]:
    """Per epoch boundary among the counted steps (`by_epoch`: the rank's step events of each
    epoch, in order): the seconds it cost beyond a step's time (validation, the epoch's report,
    the next epoch's first batches), and of those, the seconds from the epoch's last step event
    to its epoch event (validation and report)."""
    out = []
    epochs = sorted(by_epoch)
    for a, b in zip(epochs, epochs[1:], strict=False):
        last, first = by_epoch[a][-1], by_epoch[b][0]
        cost = first["t"] - last["t"] - (first["global_step"] - last["global_step"]) * step_s
        report = [e["t"] for e in evs if e["kind"] == "epoch" and e["rank"] == rank
                  and e.get("epoch") == a]
        out.append({"end_s": round(cost, 3),
                    "to_epoch_event_s": round(report[0] - last["t"], 3) if report else None})
    return out


if __name__ == "__main__":
    main()
