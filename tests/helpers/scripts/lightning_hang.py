"""examples/lightning_ddp.py whose rank 1 hangs in its 5th training step, in hang_here(): a
hang inside Lightning's trainer.fit, the callback in place."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples"))
import lightning_ddp as example  # noqa: E402


def hang_here() -> None:
    time.sleep(3600)


class Hanging(example.Classifier):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and self.global_step == 5:
            hang_here()
        return super().training_step(batch, batch_idx)


if __name__ == "__main__":
    example.Classifier = Hanging
    example.main()
