"""Each rank prints 3,000 short loss lines as fast as it can (block-buffered: its writes end
mid-line), then a last line with no newline."""

import os
import sys

rank = os.environ["RANK"]
for i in range(3000):
    print(f"rank {rank} step {i} loss {1 / (i + 1):.6f}")
sys.stdout.write(f"rank {rank} ends without a newline")
