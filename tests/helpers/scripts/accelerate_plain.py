"""A script in the shape of accelerate's examples/nlp_example.py, for `accelerate launch`: its
loop through an Accelerator, and each epoch's evaluation printed as that example prints it
(`epoch 0: {'accuracy': 0.52}`)."""

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 8), torch.randint(0, 2, (128,)))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train = DataLoader(data, batch_size=16, shuffle=True)
    evaluation = DataLoader(data, batch_size=32)
    model, opt, train, evaluation = accelerator.prepare(model, opt, train, evaluation)
    for epoch in range(2):
        model.train()
        for x, y in train:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        model.eval()
        right = total = 0
        for x, y in evaluation:
            with torch.no_grad():
                predictions = model(x).argmax(dim=-1)
            predictions, y = accelerator.gather_for_metrics((predictions, y))
            right, total = right + (predictions == y).sum().item(), total + len(y)
        accelerator.print(f"epoch {epoch}:", {"accuracy": right / total})


if __name__ == "__main__":
    main()
