"""`python -m ddptui.wrap` under torchrun against the same torchrun without it, on two torchrun
"nodes" of one GPU each on one machine, alternating, with `ddptui attach` listening.

python bench/wrap_overhead.py --rounds 4 --out results.json
Both variants run bench/plain_ddp.py unmodified, printing a loss line every --print-every steps
(loss.item(), as nanoGPT logs); the wrapper reads every line, parses it and sends it to attach.
Prints the img/s rank 0 measured (after its warm-up) per round and the ratio to plain torchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "plain_ddp.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(wrapped: bool, script_args: list[str], env: dict, cwd: str) -> float:
    """One run: node 0 on GPU 0, node 1 on GPU 1, c10d rendezvous on localhost."""
    rdzv = free_port()
    target = ["-m", "ddptui.wrap", SCRIPT] if wrapped else [SCRIPT]
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(n),
         "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
         f"127.0.0.1:{rdzv}", "--rdzv-id", f"bench-{rdzv}", *target, *script_args],
        env=dict(env, CUDA_VISIBLE_DEVICES=str(n)), cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    outs = [node.communicate() for node in nodes]
    for node, (_, err) in zip(nodes, outs, strict=True):
        if node.returncode != 0:
            raise SystemExit(f"{'wrap' if wrapped else 'torchrun'} failed:\n{err[-3000:]}")
    line = [ln for ln in outs[0][0].splitlines() if ln.startswith("{")][-1]
    return json.loads(line)["img_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--print-every", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    script_args = ["--model", args.model, "--steps", str(args.steps), "--warmup",
                   str(args.warmup), "--print-every", str(args.print_every)]
    listen = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, DDPTUI_AUTHKEY=secrets.token_hex(16), PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    rates: dict[str, list[float]] = {"torchrun": [], "wrap": []}
    with tempfile.TemporaryDirectory() as tmp:
        attach = subprocess.Popen([sys.executable, "-m", "ddptui", "attach", "--headless",
                                   "--listen", listen, "--log", os.path.join(tmp, "a.jsonl")],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for r in range(args.rounds):
                order = ("torchrun", "wrap") if r % 2 == 0 else ("wrap", "torchrun")
                for v in order:
                    rates[v].append(two_nodes(v == "wrap", script_args,
                                              dict(env, DDPTUI_REPORT=listen), tmp))
                    print(f"round {r} {v}: {rates[v][-1]:,.0f} img/s", flush=True)
            steps = sum(1 for line in open(os.path.join(tmp, "a.jsonl")) if '"step"' in line)
        finally:
            attach.kill()
    base = statistics.mean(rates["torchrun"])
    print(f"\nattach received {steps} step events from the wrapped runs")
    print("\n| variant | img/s (each round) | mean | ratio to torchrun |\n|---|---|---|---|")
    for v, xs in rates.items():
        print(f"| {v} | {', '.join(f'{x:,.0f}' for x in xs)} | {statistics.mean(xs):,.0f} | "
              f"{statistics.mean(xs) / base:.4f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rates": rates, "ratio": statistics.mean(rates["wrap"]) / base}, f)


if __name__ == "__main__":
    main()
