"""A script written for `python -m torch.distributed.launch`: its GPU (here: its line) comes from
argparse's --local_rank, which launch passed each rank on its command line."""

import argparse
import os

p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, default=-1)
p.add_argument("--tag", default="")
args = p.parse_args()
print(f"local_rank {args.local_rank} env {os.environ.get('LOCAL_RANK')} tag {args.tag}", flush=True)
