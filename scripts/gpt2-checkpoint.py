#!/usr/bin/env python3
"""Writes GPT-2-sized checkpoints with AdamW state for the GPU benchmark (scripts/gpu-check.sh).

A randomly initialised GPT-2 (default: the 355M "medium" shape) takes a few AdamW steps on
random tokens; after steps K and K+1 the weights and both moments are saved as safetensors
(`model.NAME`, `optim.NAME.exp_avg`, `optim.NAME.exp_avg_sq`: mdl's default pairing), fp32.
Needs torch, transformers and safetensors (all on the lent GPU machine).
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--layers", type=int, default=24)
p.add_argument("--embd", type=int, default=1024)
p.add_argument("--steps", type=int, default=3)
a = p.parse_args()
os.makedirs(a.out, exist_ok=True)
torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
cfg = GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=a.embd // 64)
model = GPT2LMHeadModel(cfg).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
names = {p: n for n, p in model.named_parameters()}
for step in range(1, a.steps + 2):
    x = torch.randint(0, cfg.vocab_size, (4, 256), device=dev)
    loss = model(x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step >= a.steps:
        t = {}
        for prm, n in names.items():
            t[f"model.{n}"] = prm.detach().float().cpu().contiguous()
            st = opt.state[prm]
            t[f"optim.{n}.exp_avg"] = st["exp_avg"].float().cpu().contiguous()
            t[f"optim.{n}.exp_avg_sq"] = st["exp_avg_sq"].float().cpu().contiguous()
        path = os.path.join(a.out, f"step{step}.safetensors")
        save_file(t, path, metadata={"step": str(step), "loss": f"{loss.item():.4f}"})
        print(path, os.path.getsize(path), "bytes, loss", round(loss.item(), 4), flush=True)
