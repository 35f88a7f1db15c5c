"""A Lightning script with no line for ddptui: `python lightning_plain.py ddp|ddp_spawn [cpu|gpu
[DEVICES [SAMPLES]]]` trains a small classifier (on 2 CPU devices and 256 samples by default),
logging train_loss, val_loss and val_acc to its bar."""

import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(out, y), prog_bar=True, sync_dist=True)
        self.log("val_acc", (out.argmax(1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    torch.manual_seed(0)
    samples = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    data = TensorDataset(torch.randn(samples, 8), torch.randint(0, 2, (samples,)))
    accelerator = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    devices = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    trainer = L.Trainer(accelerator=accelerator, devices=devices, strategy=sys.argv[1], max_epochs=3,
                        logger=False, enable_checkpointing=False, log_every_n_steps=1)
    trainer.fit(Classifier(), DataLoader(data, batch_size=16), DataLoader(data, batch_size=64))


if __name__ == "__main__":
    main()
