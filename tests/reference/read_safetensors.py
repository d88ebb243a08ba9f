#!/usr/bin/env python3
"""Independent check of `tessera ckpt export`: reads model.safetensors with numpy and json only,
validates the container (header size, JSON, F32 dtypes, contiguous 8-byte-aligned data), rebuilds
the expected Hugging Face tensors from tessera's own tensors (.npy files named after tessera
parameters) with the documented mapping (docs/checkpoints.md), and compares them exactly, as well
as config.json against the expected fields. Exits non-zero with a message on any mismatch.

usage: read_safetensors.py EXPORT_DIR NPY_DIR PRESET N_LAYER EXPECTED_CONFIG_JSON
"""
import json
import os
import struct
import sys

import numpy as np


def fail(msg):
    print("read_safetensors.py: " + msg, file=sys.stderr)
    sys.exit(1)


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        fail("file shorter than the 8-byte header size")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        fail(f"header size {n} runs past the end of the file ({len(raw)} bytes)")
    if (8 + n) % 8 != 0:
        fail(f"data starts at byte {8 + n}, not 8-byte aligned")
    header_text = raw[8 : 8 + n].decode("utf-8")
    if not header_text.startswith("{"):
        fail("header does not start with '{'")
    header = json.loads(header_text)
    if header.pop("__metadata__", None) != {"format": "pt"}:
        fail("__metadata__ is not {'format': 'pt'}")
    data = raw[8 + n :]
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    end = 0
    for begin, stop, name in spans:
        if begin != end:
            fail(f"{name} starts at {begin}, expected {end} (tensors must be contiguous)")
        end = stop
    if end != len(data):
        fail(f"tensors cover {end} bytes of a {len(data)}-byte buffer")
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            fail(f"{name} has dtype {info['dtype']}, expected F32")
        begin, stop = info["data_offsets"]
        shape = tuple(info["shape"])
        if stop - begin != 4 * int(np.prod(shape, dtype=np.int64)):
            fail(f"{name}: byte range {stop - begin} does not fit shape {shape}")
        tensors[name] = np.frombuffer(data[begin:stop], dtype="<f4").reshape(shape)
    return tensors


def expected_gpt2(t, n_layer):
    hf = {
        "transformer.wte.weight": t["wte.weight"],
        "transformer.wpe.weight": t["wpe.weight"],
        "transformer.ln_f.weight": t["ln_f.weight"],
        "transformer.ln_f.bias": t["ln_f.bias"],
    }
    for l in range(n_layer):
        p, h = f"blocks.{l}.", f"transformer.h.{l}."
        qkv_w = np.concatenate([t[p + "attn.q.weight"], t[p + "attn.k.weight"], t[p + "attn.v.weight"]], axis=0)
        qkv_b = np.concatenate([t[p + "attn.q.bias"], t[p + "attn.k.bias"], t[p + "attn.v.bias"]], axis=0)
        hf.update({
            h + "ln_1.weight": t[p + "ln1.weight"],
            h + "ln_1.bias": t[p + "ln1.bias"],
            h + "attn.c_attn.weight": qkv_w.T,  # Conv1D stores (in, out)
            h + "attn.c_attn.bias": qkv_b,
            h + "attn.c_proj.weight": t[p + "attn.proj.weight"].T,
            h + "attn.c_proj.bias": t[p + "attn.proj.bias"],
            h + "ln_2.weight": t[p + "ln2.weight"],
            h + "ln_2.bias": t[p + "ln2.bias"],
            h + "mlp.c_fc.weight": t[p + "mlp.fc.weight"].T,
            h + "mlp.c_fc.bias": t[p + "mlp.fc.bias"],
            h + "mlp.c_proj.weight": t[p + "mlp.proj.weight"].T,
            h + "mlp.c_proj.bias": t[p + "mlp.proj.bias"],
        })
    return hf


def expected_llama(t, n_layer):
    hf = {
        "model.embed_tokens.weight": t["wte.weight"],
        "model.norm.weight": t["ln_f.weight"],
        "lm_head.weight": t["lm_head.weight"],
    }
    for l in range(n_layer):
        p, h = f"blocks.{l}.", f"model.layers.{l}."
        hf.update({
            h + "input_layernorm.weight": t[p + "ln1.weight"],
            h + "self_attn.q_proj.weight": t[p + "attn.q.weight"],
            h + "self_attn.k_proj.weight": t[p + "attn.k.weight"],
            h + "self_attn.v_proj.weight": t[p + "attn.v.weight"],
            h + "self_attn.o_proj.weight": t[p + "attn.proj.weight"],
            h + "post_attention_layernorm.weight": t[p + "ln2.weight"],
            h + "mlp.gate_proj.weight": t[p + "mlp.gate.weight"],
            h + "mlp.up_proj.weight": t[p + "mlp.up.weight"],
            h + "mlp.down_proj.weight": t[p + "mlp.down.weight"],
        })
    return hf


def main():
    if len(sys.argv) != 6:
        fail(__doc__.strip().splitlines()[-1])
    export_dir, npy_dir, preset, n_layer, expected_config = sys.argv[1:]
    tessera = {f[: -len(".npy")]: np.load(os.path.join(npy_dir, f)) for f in os.listdir(npy_dir) if f.endswith(".npy")}
    build = {"gpt2": expected_gpt2, "llama": expected_llama}[preset]
    expected = build(tessera, int(n_layer))
    got = load_safetensors(os.path.join(export_dir, "model.safetensors"))
    if set(got) != set(expected):
        fail(f"tensor names differ: missing {sorted(set(expected) - set(got))}, extra {sorted(set(got) - set(expected))}")
    for name, want in expected.items():
        if got[name].shape != want.shape:
            fail(f"{name}: shape {got[name].shape}, expected {want.shape}")
        if not np.array_equal(got[name], want.astype(np.float32)):
            fail(f"{name}: values differ")
    with open(os.path.join(export_dir, "config.json")) as f:
        config = json.load(f)
    for key, want in json.loads(expected_config).items():
        if config.get(key) != want:
            fail(f"config.json {key} = {config.get(key)!r}, expected {want!r}")
    print(f"read_safetensors.py: {len(got)} tensors and config.json match ({preset})")


if __name__ == "__main__":
    main()
