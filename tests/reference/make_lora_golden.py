#!/usr/bin/env python3
"""Golden fixture for tessera's LoRA (tests/model/test_lora.cpp), computed by Hugging Face
transformers + peft + PyTorch: an implementation independent of tessera's.

For a tiny GPT-2 (GPT2LMHeadModel) and a tiny LLaMA (LlamaForCausalLM), in float64, with base
weights drawn here (rounded to float32 values so both tessera precisions start from the same
numbers), peft adds LoRA adapters (r = 4, alpha = 8, no dropout; A drawn by peft's
Kaiming-uniform init, rounded to float32 likewise, B zero) and runs 10 AdamW steps on one fixed
batch, the base frozen. Stored in tests/reference/lora_golden.h5, per preset:
  attrs            the model config, lora_rank, lora_alpha, lora_targets (tessera's names, comma
                   separated), AdamW settings (lr, beta1, beta2, eps, weight_decay) and steps
  tokens, targets  (B, T) int32; some targets are -1 (ignored)
  params/<name>    every tessera parameter at the start, under tessera's names: the base (HF's
                   Conv1D weights transposed, GPT-2's fused c_attn split into q, k, v) and the
                   adapters "blocks.<l>.<layer>.lora_A.weight" (r, in), "...lora_B.weight" (out, r)
  adamw_losses     (10) the mean loss before each AdamW step
  final/<name>     the adapters after the 10 steps

GPT-2 adapts attn.proj (attn.c_proj), mlp.fc (c_fc) and mlp.proj (mlp.c_proj): tessera's q, k, v
are separate layers, so an adapter on HF's fused c_attn has no tessera equivalent. LLaMA adapts
attn.q, attn.v and mlp.* (q_proj, v_proj, gate_proj, up_proj, down_proj).

Versions used: Debian's python 3.11.2 with numpy 1.24.2 and h5py 3.7.0, in a venv
(--system-site-packages) with transformers 4.46.3, peft 0.13.2 and the torch pip installed for
them (2.15.0+cu132, run on the CPU). Run:
  /usr/bin/python3 -m venv --system-site-packages /tmp/venv-lora
  /tmp/venv-lora/bin/pip install transformers==4.46.3 peft==0.13.2 safetensors
  PYTHONNOUSERSITE=1 /tmp/venv-lora/bin/python tests/reference/make_lora_golden.py
"""
import os

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

torch.set_default_dtype(torch.float64)
B, T, STEPS, RANK, ALPHA = 2, 16, 10, 4, 8.0
ADAMW = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
CONFIGS = {
    "gpt2": dict(preset="gpt2", vocab_size=97, n_layer=2, n_head=4, n_kv_head=4, n_embd=32, ffn_hidden=128,
                 max_seq_len=32, norm_eps=1e-5, rope_theta=10000.0),
    "llama": dict(preset="llama", vocab_size=97, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48,
                  max_seq_len=32, norm_eps=1e-5, rope_theta=10000.0),
}
# peft target_modules -> tessera's block-relative layer names
TARGETS = {
    "gpt2": (["attn.c_proj", "c_fc", "mlp.c_proj"], "attn.proj,mlp.fc,mlp.proj"),
    "llama": (["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"], "attn.q,attn.v,mlp.*"),
}


def hf_model(c):
    if c["preset"] == "gpt2":
        cfg = GPT2Config(vocab_size=c["vocab_size"], n_positions=c["max_seq_len"], n_embd=c["n_embd"],
                         n_layer=c["n_layer"], n_head=c["n_head"], n_inner=c["ffn_hidden"],
                         activation_function="gelu_new", layer_norm_epsilon=c["norm_eps"], resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
        return GPT2LMHeadModel(cfg).double()
    cfg = LlamaConfig(vocab_size=c["vocab_size"], hidden_size=c["n_embd"], intermediate_size=c["ffn_hidden"],
                      num_hidden_layers=c["n_layer"], num_attention_heads=c["n_head"],
                      num_key_value_heads=c["n_kv_head"], max_position_embeddings=c["max_seq_len"],
                      rms_norm_eps=c["norm_eps"], rope_theta=c["rope_theta"], tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).double()
    # transformers computes RoPE's angles in float32 whatever the model's dtype (~1e-8 relative on
    # the loss); the same formula in float64, so that the fixture is float64 throughout.
    D = c["n_embd"] // c["n_head"]
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))

    def rope64(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv_freq  # (B, T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    model.model.rotary_emb.forward = rope64
    return model


# transformers' LLaMA also rounds to float32 inside RMSNorm (its variance) and the eager attention's
# softmax (dtype=torch.float32) whatever the model's dtype: the same formulas in the input's dtype.
def _rmsnorm64(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


_softmax = torch.nn.functional.softmax


def _softmax_in_input_dtype(x, dim=None, _stacklevel=3, dtype=None):
    return _softmax(x, dim=dim) if x.dtype == torch.float64 else _softmax(x, dim=dim, dtype=dtype)


modeling_llama.LlamaRMSNorm.forward = _rmsnorm64
torch.nn.functional.softmax = _softmax_in_input_dtype


def draw_base(model, gen):
    """Every base weight redrawn, float32 values: norms 1 + 0.1 N, biases 0.1 N, the rest 0.2 N."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            elif "ln_" in name or "norm" in name:
                v = 1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            else:
                v = 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(v.to(torch.float64))


def tessera_base(model, c):
    """The base weights under tessera's names (float64 numpy)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out, C = {}, c["n_embd"]
    if c["preset"] == "gpt2":
        out["wte.weight"] = sd["transformer.wte.weight"]
        out["wpe.weight"] = sd["transformer.wpe.weight"]
        for l in range(c["n_layer"]):
            h, p = f"transformer.h.{l}.", f"blocks.{l}."
            for hf, ts in (("ln_1", "ln1"), ("ln_2", "ln2")):
                out[p + ts + ".weight"], out[p + ts + ".bias"] = sd[h + hf + ".weight"], sd[h + hf + ".bias"]
            w, b = sd[h + "attn.c_attn.weight"], sd[h + "attn.c_attn.bias"]  # Conv1D (in, 3C)
            for i, n in enumerate("qkv"):
                out[p + f"attn.{n}.weight"] = w[:, i * C:(i + 1) * C].T
                out[p + f"attn.{n}.bias"] = b[i * C:(i + 1) * C]
            for hf, ts in (("attn.c_proj", "attn.proj"), ("mlp.c_fc", "mlp.fc"), ("mlp.c_proj", "mlp.proj")):
                out[p + ts + ".weight"] = sd[h + hf + ".weight"].T
                out[p + ts + ".bias"] = sd[h + hf + ".bias"]
        out["ln_f.weight"], out["ln_f.bias"] = sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]
    else:
        out["wte.weight"] = sd["model.embed_tokens.weight"]
        names = {"input_layernorm": "ln1", "self_attn.q_proj": "attn.q", "self_attn.k_proj": "attn.k",
                 "self_attn.v_proj": "attn.v", "self_attn.o_proj": "attn.proj", "post_attention_layernorm": "ln2",
                 "mlp.gate_proj": "mlp.gate", "mlp.up_proj": "mlp.up", "mlp.down_proj": "mlp.down"}
        for l in range(c["n_layer"]):
            for hf, ts in names.items():
                out[f"blocks.{l}.{ts}.weight"] = sd[f"model.layers.{l}.{hf}.weight"]
        out["ln_f.weight"] = sd["model.norm.weight"]
        out["lm_head.weight"] = sd["lm_head.weight"]
    return {k: v.contiguous().numpy() for k, v in out.items()}


def tessera_adapter_name(peft_name):
    """base_model.model.transformer.h.0.attn.c_proj.lora_A.default.weight -> blocks.0.attn.proj.lora_A.weight"""
    parts = peft_name.split(".")
    i = parts.index("h") if "h" in parts else parts.index("layers")
    layer = ".".join(parts[i + 2:parts.index("lora_A" if "lora_A" in parts else "lora_B")])
    ab = "lora_A" if "lora_A" in parts else "lora_B"
    layer = {"attn.c_proj": "attn.proj", "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj",
             "self_attn.q_proj": "attn.q", "self_attn.v_proj": "attn.v", "mlp.gate_proj": "mlp.gate",
             "mlp.up_proj": "mlp.up", "mlp.down_proj": "mlp.down"}[layer]
    return f"blocks.{parts[i + 1]}.{layer}.{ab}.weight"


def make(c, seed):
    torch.manual_seed(seed)  # peft's Kaiming-uniform draws of A
    gen = torch.Generator().manual_seed(seed)
    model = hf_model(c)
    draw_base(model, gen)
    base = tessera_base(model, c)
    modules, targets = TARGETS[c["preset"]]
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=modules,
                                                  fan_in_fan_out=c["preset"] == "gpt2", bias="none"))
    adapters = {}
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if p.requires_grad:
                assert "lora_" in name, name
                p.copy_(p.to(torch.float32).to(torch.float64))  # float32 values
                adapters[tessera_adapter_name(name)] = p
    V = c["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=gen)
    targets_ids = torch.randint(0, V, (B, T), generator=gen)
    targets_ids[0, :3] = -1
    targets_ids[1, -1] = -1
    out = {"tokens": tokens.to(torch.int32).numpy(), "targets": targets_ids.to(torch.int32).numpy()}
    for k, v in base.items():
        out["params/" + k] = v
    for k, p in adapters.items():
        out["params/" + k] = p.detach().clone().numpy()
    opt = torch.optim.AdamW(list(adapters.values()), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
    peft_model.eval()  # no dropout anywhere (all rates are 0 too)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        logits = peft_model(input_ids=tokens).logits
        loss = F.cross_entropy(logits.reshape(-1, V), targets_ids.reshape(-1), ignore_index=-1)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    out["adamw_losses"] = np.array(losses)
    for k, p in adapters.items():
        out["final/" + k] = p.detach().clone().numpy()
    attrs = dict(c, lora_rank=RANK, lora_alpha=ALPHA, lora_targets=targets, steps=STEPS, **ADAMW)
    return out, attrs


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lora_golden.h5")
    with h5py.File(path, "w") as f:
        for i, (preset, c) in enumerate(CONFIGS.items()):
            data, attrs = make(c, 1234 + i)
            g = f.create_group(preset)
            for k, v in attrs.items():
                g.attrs[k] = v
            for k, v in data.items():
                g.create_dataset(k, data=v)
            print(preset, "losses", data["adamw_losses"])
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
