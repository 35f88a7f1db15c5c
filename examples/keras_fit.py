"""Keras 3 on the torch backend, trained with model.fit() in every process of

    ddptui run examples/keras_fit.py --cpus 2 -- --epochs 3
    ddptui run examples/keras_fit.py --gpus 0,1 -- --epochs 3

ddptui's callback makes the processes' fit() one data-parallel training (rank 0's weights at
the start, gradients averaged across ranks) and reports each rank to the dashboard. A small
classifier on random features, built here (no download). Each rank prints a checksum of its
weights at the end: the same figure on every rank.
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

from ddptui.integrations.keras import DdptuiCallback  # noqa: E402


def data(samples: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 32, generator=g)
    return TensorDataset(x, x[:, :4].argmax(1))  # learnable: the largest of 4 features


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="each step waits this long, as a GPU's host does (tests: little CPU)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:  # Keras places its variables on the current device
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    train = data(args.samples, 0)
    sampler = DistributedSampler(train)
    val = data(args.samples // 4, 1)
    val_loader = DataLoader(val, batch_size=64, sampler=DistributedSampler(val, shuffle=False))

    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(DataLoader(train, batch_size=32, sampler=sampler), epochs=args.epochs,
              validation_data=val_loader, verbose=2, shuffle=False,  # the sampler shuffles
              callbacks=[DdptuiCallback(),
                         keras.callbacks.LambdaCallback(  # a new shuffle each epoch
                             on_epoch_begin=lambda epoch, logs: sampler.set_epoch(epoch),
                             on_train_batch_begin=lambda batch, logs: time.sleep(args.step_seconds))])
    checksum = sum(float(v.value.detach().double().sum()) for v in model.weights)
    print(f"rank {dist.get_rank()} weights checksum {checksum:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
