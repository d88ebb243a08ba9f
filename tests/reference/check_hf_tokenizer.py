#!/usr/bin/env python3
"""Independent check of the tokenizer `tessera ckpt export` writes beside the weights: loads the
exported folder the way Hugging Face does and checks ids against references that do not come from
tessera, the round trip, the special tokens, and config.json's / generation_config.json's
bos_token_id and eos_token_id.

The reader is Hugging Face's own when this Python has it (`AutoTokenizer.from_pretrained(folder)`
from transformers); else a re-implementation of its GPT2Tokenizer from the exported files alone
(vocab.json, merges.txt without its first line, the special tokens of tokenizer_config.json /
special_tokens_map.json), with openai/gpt-2's encoder.py algorithm: the pre-tokenizer pattern with
Unicode letter and number classes built from unicodedata, bytes_to_unicode, BPE by merge rank. The
first line printed says which one ran.

usage: check_hf_tokenizer.py EXPORT_DIR KIND [CASES_JSON]
  KIND: gpt2 (ids from CASES_JSON: tests/reference/gpt2/tokenizer_cases.json, made with tiktoken),
        byte (ids = the UTF-8 bytes), addition (ids = positions in "0123456789+=\\n").
"""
import json
import os
import re
import sys
import unicodedata

EXPECTED = {  # kind -> (tokenizer vocabulary, end-of-text id and its token)
    "gpt2": (50257, 50256, "<|endoftext|>"),
    "byte": (257, 256, "<|endoftext|>"),
    "addition": (13, 12, "\u010a"),  # GPT-2's byte character for "\n"
}


def fail(msg):
    print("check_hf_tokenizer.py: " + msg, file=sys.stderr)
    sys.exit(1)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
    bs += list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def char_class(predicate):
    """A regex character class of every code point satisfying predicate, as ranges."""
    ranges, start, prev = [], None, None
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            ok = False
        else:
            ok = predicate(chr(cp))
        if ok and start is None:
            start = cp
        if not ok and start is not None:
            ranges.append((start, prev))
            start = None
        prev = cp
    if start is not None:
        ranges.append((start, prev))
    return "".join(re.escape(chr(a)) if a == b else re.escape(chr(a)) + "-" + re.escape(chr(b)) for a, b in ranges)


class Gpt2TokenizerFromFiles:
    """Hugging Face's GPT2Tokenizer (slow), from the exported files only."""

    def __init__(self, folder):
        with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
            self.encoder = json.load(f)
        self.decoder = {v: k for k, v in self.encoder.items()}
        with open(os.path.join(folder, "merges.txt"), encoding="utf-8") as f:
            merges = f.read().split("\n")[1:-1]  # as transformers reads it: the first line is a header
        self.ranks = {tuple(m.split()): i for i, m in enumerate(merges)}
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        with open(os.path.join(folder, "special_tokens_map.json"), encoding="utf-8") as f:
            special = json.load(f)
        if config.get("tokenizer_class") != "GPT2Tokenizer":
            fail(f"tokenizer_config.json names {config.get('tokenizer_class')!r}, expected GPT2Tokenizer")
        for key in ("bos_token", "eos_token", "unk_token"):
            if config.get(key) != special.get(key):
                fail(f"{key}: tokenizer_config.json {config.get(key)!r} != special_tokens_map.json {special.get(key)!r}")
        self.eos_token = special["eos_token"]
        self.bos_token = special["bos_token"]
        self.eos_token_id = self.encoder.get(self.eos_token)
        self.bos_token_id = self.encoder.get(self.bos_token)
        self.specials = sorted({special[k] for k in ("bos_token", "eos_token", "unk_token")}, key=len, reverse=True)
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in self.byte_encoder.items()}
        letters = char_class(lambda c: unicodedata.category(c).startswith("L"))
        numbers = char_class(lambda c: unicodedata.category(c).startswith("N"))
        space = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000")  # White_Space
        self.pat = re.compile(
            rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[{letters}]+| ?[{numbers}]+| ?[^{space}{letters}{numbers}]+"""
            rf"""|[{space}]+(?![^{space}])|[{space}]+""")
        self.cache = {}

    def __len__(self):
        return len(self.encoder)

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = list(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        self.cache[token] = word
        return word

    def encode_ordinary(self, text):
        ids = []
        for piece in self.pat.findall(text):
            chars = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            for token in self.bpe(chars):
                if token not in self.encoder:
                    fail(f"token {token!r} of {text!r} is not in vocab.json")
                ids.append(self.encoder[token])
        return ids

    def encode(self, text):
        # Special tokens in the text become their ids, as Hugging Face's added tokens do.
        if not self.specials:
            return self.encode_ordinary(text)
        parts = re.split("(" + "|".join(map(re.escape, self.specials)) + ")", text)
        ids = []
        for part in parts:
            if part in self.specials:
                ids.append(self.encoder[part])
            elif part:
                ids += self.encode_ordinary(part)
        return ids

    def decode(self, ids):
        text = "".join(self.decoder[i] for i in ids)
        return bytes(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")


def load(folder):
    try:
        import transformers  # noqa: F401
        from transformers import AutoTokenizer
    except ImportError:
        print("check_hf_tokenizer.py: reader: a re-implementation of Hugging Face's GPT2Tokenizer "
              "(transformers is not installed)")
        return Gpt2TokenizerFromFiles(folder), False
    tok = AutoTokenizer.from_pretrained(folder)
    print(f"check_hf_tokenizer.py: reader: transformers {transformers.__version__} AutoTokenizer "
          f"({type(tok).__name__})")
    return tok, True


def cases_for(kind, cases_json):
    if kind == "addition":
        alphabet = "0123456789+=\n"
        texts = ["37+45=82\n", "0+0=0\n", "99+99=198\n1+2=3\n"]
        return [(t, [alphabet.index(c) for c in t]) for t in texts]
    if kind == "byte":
        texts = ["hello world", "First Citizen:\nBefore we proceed", "caf\u00e9 \u2014 \U0001F917 \u4e2d\u6587",
                 "  spaces\t\ttabs\n\n", "<|endoftext|>"]
        return [(t, list(t.encode("utf-8")) if t != "<|endoftext|>" else [256]) for t in texts]
    with open(cases_json, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    out = []
    for c in cases:
        # Hugging Face's tokenizers always treat <|endoftext|> in text as the special token:
        # tiktoken's encode_ordinary cases that hold it literally do not apply.
        if "<|endoftext|>" in c["text"] and not c["allowed_special"]:
            continue
        out.append((c["text"], c["ids"]))
    return out


def main():
    if len(sys.argv) not in (3, 4) or sys.argv[2] not in EXPECTED:
        fail("usage: check_hf_tokenizer.py EXPORT_DIR gpt2|byte|addition [CASES_JSON]")
    folder, kind = sys.argv[1], sys.argv[2]
    vocab, eos_id, eos_token = EXPECTED[kind]
    tok, hf = load(folder)
    if len(tok) != vocab:
        fail(f"the tokenizer has {len(tok)} tokens, expected {vocab} (a special token was added?)")
    if (tok.eos_token, tok.eos_token_id, tok.bos_token_id) != (eos_token, eos_id, eos_id):
        fail(f"eos/bos: {tok.eos_token!r} {tok.eos_token_id} / {tok.bos_token_id}, expected {eos_token!r} {eos_id}")
    cases = cases_for(kind, sys.argv[3] if len(sys.argv) == 4 else None)
    for text, want in cases:
        got = tok.encode(text, add_special_tokens=False) if hf else tok.encode(text)
        if got != want:
            fail(f"{text!r}: ids {got}, expected {want}")
        back = tok.decode(got, clean_up_tokenization_spaces=False) if hf else tok.decode(got)
        if back != text:
            fail(f"{text!r} decodes back as {back!r}")
    for name in ("config.json", "generation_config.json"):
        with open(os.path.join(folder, name)) as f:
            config = json.load(f)
        if (config.get("bos_token_id"), config.get("eos_token_id")) != (eos_id, eos_id):
            fail(f"{name}: bos_token_id {config.get('bos_token_id')}, eos_token_id {config.get('eos_token_id')}, "
                 f"expected {eos_id}")
    print(f"check_hf_tokenizer.py: {kind}: {len(cases)} texts encode to the reference ids and decode back; "
          f"eos = bos = {eos_id} in the tokenizer, config.json and generation_config.json")


if __name__ == "__main__":
    main()
