#!/usr/bin/env python3
"""Makes tiny Hugging Face model folders with `transformers` (random weights, no download) and
records what transformers computes on them, for tests/app/checkpoint/test_hf_import_transformers.cpp
(this project; the independent oracle is transformers' own GPT2LMHeadModel / LlamaForCausalLM).

Versions used: Debian's python3-torch 1.13 (/usr/bin/python3), transformers==4.46.3,
tokenizers==0.20.3, safetensors 0.4+:
  /usr/bin/python3 -m venv --system-site-packages /tmp/venv-tok-sys
  PYTHONNOUSERSITE=1 /tmp/venv-tok-sys/bin/pip install transformers==4.46.3 safetensors
  PYTHONNOUSERSITE=1 /tmp/venv-tok-sys/bin/python tests/reference/make_hf_models.py

Folders under hf_models/ (each with config.json, safetensors, and the tokenizer.json of
hf_tokenizers/ whose vocabulary the model uses, so `ckpt import` records it):
  gpt2_tied:    GPT2LMHeadModel, tied head, fp32, one model.safetensors (gpt2_style tokenizer);
  gpt2_untied:  GPT2LMHeadModel, its own lm_head.weight, fp32;
  llama_sharded: LlamaForCausalLM, GQA (4 query heads, 2 key/value heads), untied, fp32, sharded
                 with model.safetensors.index.json (llama3_style tokenizer);
  llama_bf16:   LlamaForCausalLM, GQA, tied, saved in bfloat16.
and hf_models/reference.json: per folder the token ids (the tokenizer's ids of a fixed text), the
mean cross-entropy loss of predicting ids[1:], the prompt text and its greedy continuation's ids
(argmax of the full forward, step by step), plus <folder>/logits.f32: the float32 logits [T, V],
row-major, little-endian. A bf16 model's reference runs in float32 on its bf16-rounded weights
(what `ckpt import` gives tessera).
"""
import copy
import json
import os
import shutil

import torch
from tokenizers import Tokenizer
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "hf_models")
TOKENIZERS = os.path.join(HERE, "hf_tokenizers")
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak."
PROMPT = "First Citizen:"
NEW_TOKENS = 8


def gpt2(tied):
    return GPT2LMHeadModel(GPT2Config(vocab_size=800, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                      initializer_range=0.2, tie_word_embeddings=tied))


def llama(tied):
    return LlamaForCausalLM(LlamaConfig(vocab_size=800, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                        rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.2,
                                        tie_word_embeddings=tied, bos_token_id=0, eos_token_id=1))


# name: (model maker, tokenizer fixture, save options)
MODELS = {
    "gpt2_tied": (lambda: gpt2(True), "gpt2_style", {}),
    "gpt2_untied": (lambda: gpt2(False), "gpt2_style", {}),
    "llama_sharded": (lambda: llama(False), "llama3_style", {"max_shard_size": "40KB"}),
    "llama_bf16": (lambda: llama(True), "llama3_style", {"dtype": torch.bfloat16}),
}


@torch.no_grad()
def greedy(model, ids):
    ids = list(ids)
    out = []
    for _ in range(NEW_TOKENS):
        logits = model(torch.tensor([ids])).logits[0, -1]
        nxt = int(torch.argmax(logits))
        ids.append(nxt)
        out.append(nxt)
    return out


@torch.no_grad()
def make(name, maker, tok_name, options):
    torch.manual_seed(1234)
    model = maker().eval()
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    dtype = options.get("dtype")
    saved = model
    if dtype is not None:
        # The reference runs in float32 on the weights rounded to dtype; only parameters are rounded
        # (model.to(dtype) would round the rotary inv_freq buffer too, which tessera computes).
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
        saved = copy.deepcopy(model).to(dtype)
    saved.save_pretrained(folder, safe_serialization=True, max_shard_size=options.get("max_shard_size", "10GB"))
    tok_path = os.path.join(TOKENIZERS, tok_name + ".json")
    shutil.copy(tok_path, os.path.join(folder, "tokenizer.json"))
    tok = Tokenizer.from_file(tok_path)
    ids = tok.encode(TEXT, add_special_tokens=False).ids
    prompt_ids = tok.encode(PROMPT, add_special_tokens=False).ids
    x = torch.tensor([ids])
    logits = model(x).logits[0]  # [T, V]
    loss = torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:]).item()
    logits.numpy().astype("<f4").tofile(os.path.join(folder, "logits.f32"))
    return {"ids": ids, "loss": loss, "vocab_size": model.config.vocab_size, "prompt": PROMPT,
            "prompt_ids": prompt_ids, "greedy_ids": greedy(model, prompt_ids)}


def main():
    os.makedirs(OUT, exist_ok=True)
    ref = {name: make(name, *spec) for name, spec in MODELS.items()}
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    for name, r in ref.items():
        print(name, len(r["ids"]), "tokens, loss", r["loss"], "greedy", r["greedy_ids"])


if __name__ == "__main__":
    main()
