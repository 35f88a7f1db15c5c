"""A PyTorch Lightning script with ddptui's callback: one line in the Trainer's callbacks.

    ddptui run examples/lightning_ddp.py --cpus 2 -- --epochs 3
    ddptui run examples/lightning_ddp.py --gpus 0,1 -- --epochs 3

Under ddptui run, Lightning sees torchrun's environment and starts no processes of its own. A
small classifier on random features, built here (no download); its training data comes through
ddptui's loader, so the dashboard's w/W, p and a steer its DataLoader.
"""

import argparse
import os
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddptui
from ddptui.integrations.lightning import DdptuiCallback


class Classifier(L.LightningModule):
    def __init__(self, samples: int, features: int = 32, classes: int = 4, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, classes))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self):
        # ddptui's loader: its workers and prefetcher follow w/W, p and a on the dashboard
        # (a plain DataLoader without ddptui). Lightning leaves its sampler alone: shard here.
        train = data(self.hparams.samples, 0)
        return ddptui.init().loader(train, batch_size=32, sampler=DistributedSampler(train))

    def val_dataloader(self):
        return DataLoader(data(self.hparams.samples // 4, 1), batch_size=64)


def data(samples: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 32, generator=g)
    return TensorDataset(x, (x[:, :4].argmax(1)))  # learnable: the largest of 4 features


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--devices", type=int, default=None, help="default: WORLD_SIZE")
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="each step waits this long, as a GPU's host does (tests: little CPU)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    devices = args.devices or int(os.environ.get("WORLD_SIZE", 1))
    trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=devices, strategy="ddp",
                        max_epochs=args.epochs, callbacks=[DdptuiCallback()], logger=False,
                        enable_progress_bar=True)
    model = Classifier(args.samples)
    if args.step_seconds:
        model.net.register_forward_pre_hook(lambda *_: time.sleep(args.step_seconds))
    trainer.fit(model)


if __name__ == "__main__":
    main()
