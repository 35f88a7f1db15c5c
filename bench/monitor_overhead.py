"""What --metrics and --notify cost the built-in loop: the same run with neither and with both
(its endpoint scraped once a second, its messages to a local receiver), alternating in one call.

python bench/monitor_overhead.py --rounds 3 --steps 300 --warmup 60
Each row: img/s over the same steady window (bench/compare.py's), without and with; the ratio of
the medians. Then the GPU series' `uuid` labels against `nvidia-smi --query-gpu=uuid`.
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from compare import ours


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int, halt: threading.Event, seen: list[str]) -> None:
    while not halt.wait(1.0):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                seen.append(r.read().decode())
        except OSError:
            pass  # not up yet, or gone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=60)
    args = ap.parse_args()
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{hook.server_address[1]}/hook"
    plain, watched, seen = [], [], []
    print("| round | neither img/s | --metrics + --notify img/s |")
    print("|---|---|---|")
    for n in range(args.rounds):
        plain.append(ours(args.model, 1, args.steps, args.warmup, [])["img_s"])
        port, halt = _port(), threading.Event()
        scraper = threading.Thread(target=_scrape, args=(port, halt, seen), daemon=True)
        scraper.start()
        watched.append(ours(args.model, 1, args.steps, args.warmup,
                            ["--metrics", str(port), "--notify", url])["img_s"])
        halt.set()
        scraper.join()
        print(f"| {n + 1} | {plain[-1]:,.0f} | {watched[-1]:,.0f} |", flush=True)
    ratio = statistics.median(watched) / statistics.median(plain)
    print(f"\nratio of the medians: {ratio:.4f} ({len(seen)} scrapes)")
    labels = set(re.findall(r'uuid="([^"]+)"', "".join(seen[-3:])))
    smi = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.split()
    print(f"uuid labels {sorted(labels)}; nvidia-smi {smi}; "
          f"{'equal' if labels and labels <= set(smi) else 'NOT equal'}")
    hook.shutdown()
    sys.exit(0)


if __name__ == "__main__":
    main()
