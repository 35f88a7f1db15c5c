"""A Hugging Face Trainer script with no line for ddptui: a tiny random BERT classifier (made
from its config: nothing downloaded), 2 epochs, evaluated each epoch."""

import os

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 100, (n, 16), generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.x[i], "labels": self.y[i]}


def main() -> None:
    config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, num_labels=2)
    args = TrainingArguments(output_dir=os.path.join(os.getcwd(), "hf-out"), num_train_epochs=2,
                             per_device_train_batch_size=8, logging_steps=1,
                             eval_strategy="epoch", save_strategy="no", report_to=[],
                             use_cpu=True)
    Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Tokens(64),
            eval_dataset=Tokens(16)).train()


if __name__ == "__main__":
    main()
