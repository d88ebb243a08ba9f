#!/usr/bin/env python3
"""PEFT-made LoRA adapter folders for tests/app/checkpoint/test_peft_export.cpp: what `tessera ckpt
export --adapters-only` must write, made by the peft library itself (an implementation independent
of tessera's), so the test checks tessera's adapter_config.json keys and tensor names, shapes and
layout against peft's own.

Two tiny models, drawn from their configs (the base weights do not matter: only the adapters are
saved), with LoRA r = 4, alpha = 8, no dropout:
  llama/  LlamaForCausalLM, hidden 32, 2 layers, 4 heads, 2 kv heads, intermediate 48;
          targets q_proj k_proj v_proj o_proj gate_proj up_proj down_proj (tessera attn.*, mlp.*)
  gpt2/   GPT2LMHeadModel, n_embd 32, 2 layers, 4 heads (n_inner 128);
          targets attn.c_proj mlp.c_fc mlp.c_proj (tessera attn.proj, mlp.fc, mlp.proj)
Each adapter tensor is filled with exactly representable values given by a formula of its element
index i (row-major), its layer l, the tessera layer's index m in model/lora.h lora_layer_names
(gpt2: attn.q k v proj, mlp.fc proj; llama: attn.q k v proj, mlp.gate up down) and whether it is B:
    v = (((7 i + 13 l + 5 m + 3 is_b) mod 17) - 8) / 16
which the C++ test computes for tessera's tensors (A (r, in), B (out, r) in both).

Versions used: Debian's python 3.11.2 in a venv (--system-site-packages) with transformers 4.46.3,
peft 0.13.2, safetensors and the torch pip installed for them (2.15.0+cu132, run on the CPU). Run:
  /usr/bin/python3 -m venv --system-site-packages /tmp/venv-lora
  /tmp/venv-lora/bin/pip install transformers==4.46.3 peft==0.13.2 safetensors
  PYTHONNOUSERSITE=1 /tmp/venv-lora/bin/python tests/reference/make_peft_adapters.py
"""
import os
import re

import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peft_adapters")

# HF module (within a layer) -> index of the tessera layer in lora_layer_names(preset).
LLAMA = {"self_attn.q_proj": 0, "self_attn.k_proj": 1, "self_attn.v_proj": 2, "self_attn.o_proj": 3,
         "mlp.gate_proj": 4, "mlp.up_proj": 5, "mlp.down_proj": 6}
GPT2 = {"attn.c_attn": None, "attn.c_proj": 3, "mlp.c_fc": 4, "mlp.c_proj": 5}


def fill(model, table, layer_re):
    for name, p in model.named_parameters():
        if "lora_" not in name:
            continue
        m = re.search(layer_re + r"\.(\d+)\.(.+)\.lora_([AB])\.", name)
        l, module, ab = int(m.group(1)), m.group(2), m.group(3)
        idx = torch.arange(p.numel(), dtype=torch.int64)
        v = ((7 * idx + 13 * l + 5 * table[module] + 3 * (ab == "B")) % 17 - 8).to(torch.float32) / 16
        with torch.no_grad():
            p.copy_(v.reshape(p.shape))


def save(model, targets, table, layer_re, sub):
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM", bias="none")
    peft_model = get_peft_model(model, cfg)
    fill(peft_model, table, layer_re)
    peft_model.save_pretrained(os.path.join(OUT, sub))
    os.remove(os.path.join(OUT, sub, "README.md"))  # peft's model card template: not part of the format


def main():
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64))
    save(llama, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], LLAMA,
         r"layers", "llama")
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    save(gpt2, ["attn.c_proj", "mlp.c_fc", "mlp.c_proj"], GPT2, r"h", "gpt2")


if __name__ == "__main__":
    main()
