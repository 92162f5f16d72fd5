"""Writes a Trainer-format checkpoint series of a GPT-2-small-sized model (124M parameters,
random init, AdamW): OUT/checkpoint-{1..N}/ as transformers' Trainer saves them (model.safetensors,
optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json, training_args.bin, configs), and
beside each OUT/single-{k}.safetensors holding the same tensors — the weights and every
optimizer storage — as one safetensors file (the baseline a tree must match).

    $(scripts/python-env.sh)/bin/python bench/trainer-series/make.py OUT [--saves 5]
"""

import argparse
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 50257, (n, 64), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--saves", type=int, default=5)
    a = p.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())
    n = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n / 1e6:.1f}M")
    args = TrainingArguments(
        output_dir=a.out,
        max_steps=a.saves,
        save_steps=1,
        logging_steps=1,
        per_device_train_batch_size=2,
        learning_rate=3e-4,
        weight_decay=0.1,
        report_to=[],
        use_cpu=True,
        seed=0,
    )
    Trainer(model=model, args=args, train_dataset=Tokens(64)).train()
    for k in range(1, a.saves + 1):
        ck = os.path.join(a.out, f"checkpoint-{k}")
        tensors = dict(load_file(os.path.join(ck, "model.safetensors")))
        opt = torch.load(os.path.join(ck, "optimizer.pt"), weights_only=True)
        for i, st in opt["state"].items():
            for name, t in st.items():
                tensors[f"optimizer.state.{i}.{name}"] = t.contiguous()
        save_file(tensors, os.path.join(a.out, f"single-{k}.safetensors"))
        print(ck, sum(os.path.getsize(os.path.join(ck, f)) for f in os.listdir(ck)))


if __name__ == "__main__":
    main()
