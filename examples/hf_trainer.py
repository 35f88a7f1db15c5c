"""A Hugging Face Trainer script with ddptui's callback: one line in the Trainer's callbacks.

    ddptui run examples/hf_trainer.py --cpus 2 -- --epochs 3
    ddptui run examples/hf_trainer.py --gpus 0,1 -- --epochs 3

Under ddptui run the Trainer (through Accelerate) takes the launch for torchrun's. A small
classifier on random features, built here (no download, no tokenizer).
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments

from ddptui.integrations.transformers import DdptuiCallback


class Classifier(torch.nn.Module):
    def __init__(self, features: int = 32, classes: int = 4):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, classes))

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


class Features(torch.utils.data.Dataset):
    def __init__(self, samples: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(samples, 32, generator=g)
        self.y = self.x[:, :4].argmax(1)  # learnable: the largest of 4 features

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def accuracy(prediction) -> dict:
    logits, labels = prediction.predictions, prediction.label_ids
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--output-dir", default="hf-output")
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="each step waits this long, as a GPU's host does (tests: little CPU)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    training = TrainingArguments(
        output_dir=args.output_dir, num_train_epochs=args.epochs, per_device_train_batch_size=32,
        per_device_eval_batch_size=64, learning_rate=0.1, eval_strategy="epoch",
        save_strategy="no", logging_steps=10, report_to=[], use_cpu=not cuda,
        ddp_backend=None if cuda else "gloo", dataloader_num_workers=0,
        disable_tqdm=os.environ.get("RANK", "0") != "0")
    model = Classifier()
    if args.step_seconds:
        model.net.register_forward_pre_hook(lambda *_: time.sleep(args.step_seconds))
    trainer = Trainer(model=model, args=training, train_dataset=Features(args.samples, 0),
                      eval_dataset=Features(args.samples // 4, 1), compute_metrics=accuracy,
                      callbacks=[DdptuiCallback()])
    trainer.train()


if __name__ == "__main__":
    main()
