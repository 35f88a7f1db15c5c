"""Prints what a launcher gave this rank (environment, session, GPUs) as one JSON line."""

import json
import os
import sys

names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
         "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS",
         "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED", "CHAINED"]
print(json.dumps({"env": {n: os.environ.get(n) for n in names}, "argv": sys.argv[1:],
                  "leader": os.getsid(0) == os.getpid() == os.getpgid(0),
                  "unbuffered": "-u" in sys.orig_argv}))
