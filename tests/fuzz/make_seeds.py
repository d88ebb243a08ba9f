#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets, tests/fuzz/corpus/<target>/ (committed; rerun to
regenerate). Seeds come from the project's own files: configs/*.toml, the formats' fixtures as the
tests build them (tests/data), ../shared/data's GPT-2 cases and texts when present, and a tiny real
checkpoint trained by the tessera binary (its path is the first argument; without it the checkpoint
seeds are left as they are) and one written with h5py (Debian's python3-h5py).

    /usr/bin/python3 tests/fuzz/make_seeds.py build/tessera
"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")


def target_dir(target):
    d = os.path.join(CORPUS, target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def write(d, name, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- config: the presets, some with --set overrides after NUL bytes (tests/fuzz/config.cpp) ----

def config_seeds():
    d = target_dir("config")
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.toml"))):
        write(d, os.path.basename(path), open(path, "rb").read())
    quick = open(os.path.join(ROOT, "configs", "quickstart.toml"), "rb").read()
    write(d, "quickstart_overrides", quick + b"\0train.steps=5\0model.n_layer = 2\0optim.decay=\"linear\"")
    write(d, "empty_with_override", b"\0data.train=[{path=\"x\", weight=0.5}]")
    write(d, "blend.toml", b"[data]\ntask = \"tokens\"\n[[data.train]]\npath = \"a\"\nweight = 1\n"
                           b"[[data.train]]\npath = \"b*.bin\"\nweight = 2.5\n[train]\nname = \"x\"\n")
    write(d, "inline.toml", b"model = { n_layer = 2, preset = \"llama\" }\n[optim]\nlr = 3e-4\nmin_lr = 0.0\n")


# ---- json and the GPT-2 vocabulary ----

BYTE_TO_UNICODE = {}


def byte_to_unicode():
    if not BYTE_TO_UNICODE:
        printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
        n = 256
        for b in range(256):
            if b in printable:
                BYTE_TO_UNICODE[b] = chr(b)
            else:
                BYTE_TO_UNICODE[b] = chr(n)
                n += 1
    return BYTE_TO_UNICODE


def mapped(bs):
    m = byte_to_unicode()
    return "".join(m[b] for b in bs)


TINY_MERGES = [(b"h", b"e"), (b"l", b"l"), (b"he", b"ll"), (b"hell", b"o"), (b" ", b"w"), (b"o", b"r"),
               (b" w", b"or"), (b"l", b"d"), (b" wor", b"ld")]


def tiny_vocab(ensure_ascii):
    vocab = {mapped(bytes([b])): b for b in range(256)}
    for i, (l, r) in enumerate(TINY_MERGES):
        vocab[mapped(l + r)] = 256 + i
    vocab["<|endoftext|>"] = 256 + len(TINY_MERGES)
    enc = json.dumps(vocab, ensure_ascii=ensure_ascii)
    bpe = "#version: 0.2\n" + "".join(mapped(l) + " " + mapped(r) + "\n" for l, r in TINY_MERGES)
    return enc.encode(), bpe.encode()


def json_seeds():
    d = target_dir("json")
    enc, _ = tiny_vocab(True)
    write(d, "tiny_encoder.json", enc)
    write(d, "tiny_encoder_utf8.json", tiny_vocab(False)[0])
    write(d, "escapes.json", b'{"a\\"\\\\\\/\\n\\t": -1, "\\u0120x": 3, "\\ud83e\\udd17": 40, "\xc3\xa9": 5}')
    write(d, "line.jsonl", b'{"id": 3, "meta": {"text": "nested", "a": [1, 2.5e3, true, null, {"x": "]}"}]}, '
                           b'"text": "top \\ud83d\\ude00 \\ud83dx", "after": false}')
    write(d, "empty.json", b"{}")
    cases = os.path.join(SHARED, "gpt2", "tokenizer_cases.json")
    if os.path.exists(cases):
        lines = [l for l in open(cases, "rb").read().split(b"\n") if l.startswith(b'{"text": ')]
        for i, line in enumerate(lines[:12]):
            write(d, "case_%02d.jsonl" % i, line.rstrip(b","))


def gpt2_vocab_seeds():
    d = target_dir("gpt2_vocab")
    for ascii_only in (True, False):
        enc, bpe = tiny_vocab(ascii_only)
        write(d, "tiny_%s" % ("ascii" if ascii_only else "utf8"), enc + b"\0" + bpe + b"\0hello world <|endoftext|>")
    enc, bpe = tiny_vocab(True)
    write(d, "crlf", enc + b"\0" + bpe.replace(b"\n", b"\r\n") + b"\0 hello\r\nworld")


def gpt2_encode_seeds():
    d = target_dir("gpt2_encode")
    write(d, "hello", b"hello world <|endoftext|> Hello")
    write(d, "contractions", b"I'm you're he'll THEY'VE it's 's 'd 123 4567 3.14 $%^ \t\n  \n\n")
    write(d, "unicode", "caf\u00e9 \u4e2d\u6587 \U0001F600 na\u00efve \u0394x \u00a0nbsp".encode())
    write(d, "bad_utf8", b"\xff\xfe\x80abc\xc3\x28 \xe2\x82 \xf0\x9f\x98")
    cases = os.path.join(SHARED, "gpt2", "tokenizer_cases.json")
    if os.path.exists(cases):
        for i, case in enumerate(json.load(open(cases, encoding="utf-8"))["cases"][:24]):
            text = case["text"].encode("utf-8", "surrogatepass")
            if len(text) <= 2048:
                write(d, "case_%02d" % i, text)
    shakespeare = os.path.join(SHARED, "tinyshakespeare.txt")
    if os.path.exists(shakespeare):
        write(d, "shakespeare", open(shakespeare, "rb").read()[:1500])


# ---- token files (data/indexed_dataset.h, data/llmc_shard.h) ----

DTYPES = {"uint8": (1, "B"), "int8": (2, "b"), "int16": (3, "h"), "int32": (4, "i"), "int64": (5, "q"), "uint16": (8, "H")}


def indexed(docs, dtype="uint16", modes=False):
    """(idx bytes, bin bytes) as IndexedDatasetBuilder writes them: one sequence per document."""
    code, fmt = DTYPES[dtype]
    size = struct.calcsize(fmt)
    lengths = [len(d) for d in docs]
    pointers, p = [], 0
    for n in lengths:
        pointers.append(p)
        p += n * size
    idx = b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, code, len(docs), len(docs) + 1)
    idx += struct.pack("<%di" % len(docs), *lengths) + struct.pack("<%dq" % len(docs), *pointers)
    idx += struct.pack("<%dq" % (len(docs) + 1), *range(len(docs) + 1))
    if modes:
        idx += bytes(len(docs))
    data = b"".join(struct.pack("<%d%s" % (len(doc), fmt), *doc) for doc in docs)
    return idx, data


def indexed_seeds():
    d = target_dir("indexed_dataset")
    docs = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12, 13, 14], [15]]
    cases = {
        "uint16": indexed(docs),
        "int32": indexed(docs, "int32"),
        "uint8": indexed(docs, "uint8"),
        "int64": indexed(docs, "int64"),
        "multimodal": indexed(docs, "uint16", modes=True),
        "empty_documents": indexed([[], [1, 2, 3], []]),
        "no_sequences": indexed([]),
        "one_token": indexed([[999]]),
    }
    for name, (idx, data) in cases.items():
        write(d, name, struct.pack("<I", len(idx)) + idx + data)


def llmc(tokens, magic=20240520, version=1):
    header = struct.pack("<3i", magic, version, len(tokens)) + bytes(4 * 253)
    return header + struct.pack("<%dH" % len(tokens), *tokens)


def llmc_seeds():
    d = target_dir("llmc_shard")
    write(d, "ten_tokens", llmc(list(range(10))))
    write(d, "empty", llmc([]))
    write(d, "large_ids", llmc([50256, 0, 65535, 999, 1]))
    write(d, "llama3_magic", llmc([1, 2], magic=20240801, version=2))


# ---- checkpoints: real ones, trained for one step by the tessera binary ----

def checkpoint_seeds(tessera):
    d = target_dir("checkpoint")
    variants = {
        "gpt2_step1.h5": [],
        "llama_step1.h5": ["model.preset=llama", "model.n_head=2", "model.n_kv_head=1", "model.n_embd=4"],
    }
    for name, extra in variants.items():
        with tempfile.TemporaryDirectory() as run:
            sets = ["model.n_layer=1", "model.n_head=1", "model.n_embd=4", "train.steps=1", "train.seq_len=12",
                    "train.global_batch=1", "train.micro_batch=1", "data.val_examples=1", "train.eval_every=0"] + extra
            cmd = [tessera, "train", os.path.join(ROOT, "configs", "quickstart.toml"), "--run-dir", run]
            for s in sets:
                cmd += ["--set", s]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
            shutil.copy(os.path.join(run, "checkpoints", "step_00000001.h5"), os.path.join(d, name))
    # A valid HDF5 file with a declared (2^40, 2^40) tensor (no data): the reader must refuse the
    # shape, not overflow (tests/app/checkpoint/test_checkpoint_io.cpp ImplausibleShapesAreRefusedNamingTheTensor).
    import h5py
    import numpy
    with h5py.File(os.path.join(d, "huge_shape.h5"), "w", libver=("v108", "v110")) as f:
        meta = f.create_group("meta")
        for key in ("format_version", "step", "tokens_seen", "consumed_samples"):
            meta.attrs[key] = numpy.int64(1)
        meta.attrs["tessera_version"] = numpy.bytes_(b"0.1.0")
        meta.attrs["config"] = numpy.bytes_(b"[train]\n")
        f.create_dataset("model/x", shape=(2 ** 40, 2 ** 40), dtype="<f4", chunks=(1, 4))


# ---- checkpoint_objects: programs for tests/fuzz/checkpoint_objects.cpp that write checkpoints ----
# Op bytes: 0 group, 1 attribute, 2 dataset, 3 link; indices into its kPaths and kAttributes.

def attr_i64(path, name, value):
    return bytes([1, path, name, 3, 0]) + struct.pack("<q", value)  # int64 type, scalar space


def attr_str(path, name, text):
    return bytes([1, path, name, 8, 1, 0, len(text)]) + text + bytes([1])  # vlen UTF-8, scalar, non-null


def dataset_f32(path, dims, values):
    out = bytes([2, path, 1, 2, len(dims) - 1])  # float32, simple space of rank len(dims)
    for d in dims:
        out += bytes([d, 1])  # dimension d, fixed maximum
    out += bytes([0]) + bytes([1] * len(dims)) + bytes([1, 1])  # chunks of 2, Fletcher32, written
    return out + struct.pack("<%df" % len(values), *values)


def checkpoint_object_seeds():
    d = target_dir("checkpoint_objects")
    meta = bytes([0, 0])  # group /meta
    meta += attr_i64(0, 0, 1) + attr_str(0, 1, b"0.1.0") + attr_i64(0, 2, 7) + attr_i64(0, 3, 896)
    meta += attr_i64(0, 4, 112) + attr_str(0, 5, b"[train]\nsteps = 5\n")
    write(d, "meta_only", meta)
    tensors = dataset_f32(3, [2, 3], [0.5, -1, 2, 3, 4, 5]) + dataset_f32(6, [4], [1, 2, 3, 4])
    write(d, "two_tensors", meta + tensors + attr_i64(2, 2, 7))
    write(d, "links", meta + tensors + bytes([3, 8, 3, 0, 3, 10, 4, 1]))
    # A declared, unwritten (2^40, 2^40) float32 tensor: dimension byte 200 + 40 - 13 (dim() in
    # checkpoint_objects.cpp), chunks of 1, no Fletcher32, left unwritten.
    write(d, "huge_dims", meta + bytes([2, 3, 1, 2, 1, 227, 1, 227, 1, 0, 0, 0, 0, 0]))


# ---- safetensors: small files as transformers writes them, in each float dtype and others ----

def safetensors_file(tensors, metadata=None):
    """tensors: (name, dtype, shape, raw bytes); the header padded to 8 bytes as the format's writers do."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    d = target_dir("safetensors")
    f32 = struct.pack("<6f", 1.0, -2.5, 0.0, 3.25, 1e-30, 65504.0)
    write(d, "f32", safetensors_file([("a.weight", "F32", [2, 3], f32), ("b", "F32", [], struct.pack("<f", 7.0))],
                                     {"format": "pt"}))
    write(d, "f16_bf16", safetensors_file([("h", "F16", [4], struct.pack("<4H", 0x3C00, 0x0001, 0x7C00, 0xFC00)),
                                           ("b", "BF16", [2, 1], struct.pack("<2H", 0x3F80, 0x7FC1))]))
    write(d, "other_dtypes", safetensors_file([("q.qweight", "I32", [2], struct.pack("<2i", 1, -1)),
                                               ("m", "BOOL", [3], b"\x01\x00\x01"),
                                               ("s", "F8_E4M3", [2], b"\x38\x40"),
                                               ("e", "F32", [0, 4], b"")]))
    write(d, "empty", safetensors_file([], {}))


def main():
    config_seeds()
    json_seeds()
    gpt2_vocab_seeds()
    gpt2_encode_seeds()
    indexed_seeds()
    llmc_seeds()
    checkpoint_object_seeds()
    safetensors_seeds()
    if len(sys.argv) > 1:
        checkpoint_seeds(sys.argv[1])
    for t in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, t))
        total = sum(os.path.getsize(os.path.join(CORPUS, t, f)) for f in files)
        print("%-16s %3d seeds, %7d bytes" % (t, len(files), total))


if __name__ == "__main__":
    main()
