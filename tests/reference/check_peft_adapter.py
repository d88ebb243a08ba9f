#!/usr/bin/env python3
"""Checks `tessera ckpt export --adapters-only` with Hugging Face transformers + peft: the base model
folder (`tessera ckpt export BASE.h5 --out BASE_DIR`, the LoRA run's checkpoint.init_from) with the
adapter folder loaded by peft's PeftModel.from_pretrained must give the logits and loss of the
merged folder (`tessera ckpt export LORA.h5 --out MERGED_DIR --merge-lora`), which
tests/app/test_lora.cpp (LoraExport) checks against tessera's own adapted model. It also prints the
base model's loss, which must differ (the adapters change the model). Run by hand (docs/finetuning.md
records the result):
  PYTHONNOUSERSITE=1 /tmp/venv-lora/bin/python tests/reference/check_peft_adapter.py BASE_DIR ADAPTER_DIR MERGED_DIR
Versions used: transformers 4.46.3, peft 0.13.2, torch 2.15.0 (CPU), as make_peft_adapters.py.
"""
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def loss_and_logits(model, tokens):
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens)
    return out.loss.item(), out.logits


def main():
    base_dir, adapter_dir, merged_dir = sys.argv[1:4]
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    tokens = torch.randint(0, base.config.vocab_size, (2, min(32, base.config.max_position_embeddings)))
    base_loss, _ = loss_and_logits(base, tokens)
    peft_model = PeftModel.from_pretrained(base, adapter_dir)
    peft_loss, peft_logits = loss_and_logits(peft_model, tokens)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, torch_dtype=torch.float32)
    merged_loss, merged_logits = loss_and_logits(merged, tokens)
    diff = (peft_logits - merged_logits).abs().max().item()
    scale = merged_logits.abs().max().item()
    print(f"base loss {base_loss:.6f}  base+PEFT adapter loss {peft_loss:.6f}  merged loss {merged_loss:.6f}  "
          f"max |logits diff| {diff:.3g} (max |logit| {scale:.3g})")
    # float32: the merged weight is rounded once more than the adapter's two GEMMs (~1e-7 relative).
    ok = diff <= 1e-4 * max(scale, 1.0) and abs(peft_loss - base_loss) > 1e-6
    print("OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
