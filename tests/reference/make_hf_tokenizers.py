#!/usr/bin/env python3
"""Makes the tokenizer.json fixtures and their exact ids for tests/data/test_hf_bpe_tokenizer.cpp
and tests/data/test_llama3_pretokenizer.cpp (this project; the independent oracle is the
`tokenizers` library itself, and Python's `regex` module for the split pattern).

Versions used: Python 3.11, tokenizers==0.20.3, regex==2026.12.2.
Setup:  python3 -m venv /tmp/venv-tok && /tmp/venv-tok/bin/pip install tokenizers==0.20.3 regex
Run:    /tmp/venv-tok/bin/python tests/reference/make_hf_tokenizers.py [TEXT_FILE]

Trains two small byte-level BPE tokenizers on local text (TEXT_FILE, else the workspace's Tiny
Shakespeare at ../shared/data/tinyshakespeare.txt when present, else only the built-in text below;
the built-in text is always added, for unicode, numbers and code):
  hf_tokenizers/gpt2_style.json:  ByteLevel pre-tokenizer (GPT-2 regex), merges written as "a b"
                                  strings, <|endoftext|>;
  hf_tokenizers/llama3_style.json: Split(LLaMA-3 regex) + ByteLevel(use_regex=false), merges as
                                  ["a", "b"] pairs, ignore_merges, <|begin_of_text|> and friends.
and hf_tokenizers/cases.json: for each test string, the ids each tokenizer gives (the library's
encode(add_special_tokens=False): special tokens in the text are matched) and the LLaMA-3 split
pieces (checked equal between `regex` and the library's pre-tokenizer).
"""
import json
import os
import sys

import regex
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "hf_tokenizers")
SHAKESPEARE = os.path.join(HERE, "..", "..", "..", "shared", "data", "tinyshakespeare.txt")
VOCAB_SIZE = 800
TRAIN_BYTES = 300_000

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>"]

BUILTIN_TEXT = """\
The quick brown fox jumps over the lazy dog. It's 2024; we'll see what they've done, haven't they?
Numbers: 1 12 123 1234 12345 3.14159 1,000,000 -42 +7 0x1F 2e10 ½ ² ٣ ५.
Café, naïve, résumé, Zürich, Ångström, façade, coöperate. Straße. ÆØÅ æøå.
Привет, мир! Как дела? Γειά σου κόσμε. שלום עולם. مرحبا بالعالم. नमस्ते दुनिया.
日本語のテキスト、中文文本，한국어 텍스트。 Emoji: 😀 🎉 👍🏽 ❤️ 👨‍👩‍👧 🇫🇷.
def main(argc, argv):\n    return {"key": [1, 2, 3], 'x': None}  # comment\n\tindented\ttabs
   leading spaces, trailing spaces   \n\n\nmany newlines\r\nwindows line\r\n
DON'T SHOUT, I'LL WHISPER; YOU'RE RIGHT, WE'VE WON, HE'D GO, I'M HERE.
"""

CASES = [
    "", "a", " ", "Hello world", "Hello, world!", "  two leading spaces", "trailing spaces   ",
    "It's we'll they've don't I'd you're I'm", "DON'T YOU'LL WE'VE SHE'D THEY'RE I'M IT'S",
    "x 're 's", "''s !!'s 'sx 'l",
    "1 12 123 1234 12345 123456", "3.14159 and 2,718,281", "year2024 v1.2.3 0x1F",
    "½ ² ٣٤٥ ५६", "Café naïve résumé Zürich", "Straße ÆØÅ",
    "Привет, мир!", "Γειά σου κόσμε", "日本語のテキスト", "中文，标点。", "한국어 텍스트",
    "😀🎉 👍🏽 ❤️ 👨‍👩‍👧 🇫🇷", "a\u0301 e\u0301",
    "line one\nline two", "a\n\nb", "a \n\nb", "a\t!", "a\tb", "a  \n", "   ", "\n", "\n\n\n",
    "a\r\nb\r\n", "x \t y", "tabs\tand\tmore\t", "  \n  indented\n    block\n",
    "a\u3000\u3000b", "a\u00a0b", "a\u2003 b", "a\u001c b",
    "def f(x):\n    return x ** 2  # square\n", "{\"key\": [1, 2, 3]}", "<html><body>hi</body></html>",
    "email@example.com https://example.org/path?q=1&r=2",
    "<|endoftext|>", "Hello<|endoftext|>world", "a <|endoftext|> b<|endoftext|><|endoftext|>",
    "<|begin_of_text|>Hello<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "<|begin_of_text|><|end_of_text|>", "<|endoftext", "<|begin_of_text", "The end.<|end_of_text|>",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
]


def training_text(argv):
    parts = [BUILTIN_TEXT]
    path = argv[1] if len(argv) > 1 else (SHAKESPEARE if os.path.exists(SHAKESPEARE) else None)
    if path:
        with open(path, encoding="utf-8") as f:
            parts.append(f.read(TRAIN_BYTES))
    return parts


def train(pre_tokenizer, special, text, **bpe_options):
    tok = Tokenizer(models.BPE(**bpe_options))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer)
    return tok


def save(tok, name, merges_as_strings):
    path = os.path.join(OUT, name)
    doc = json.loads(tok.to_str())
    merges = doc["model"]["merges"]
    doc["model"]["merges"] = [" ".join(m) if merges_as_strings else list(m) for m in
                              (m.split(" ") if isinstance(m, str) else m for m in merges)]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    return Tokenizer.from_file(path)  # the cases come from the file as saved


def main(argv):
    os.makedirs(OUT, exist_ok=True)
    text = training_text(argv)
    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"], text)
    llama3_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    llama3 = train(llama3_pre, LLAMA3_SPECIAL, text, ignore_merges=True)
    gpt2 = save(gpt2, "gpt2_style.json", merges_as_strings=True)
    llama3 = save(llama3, "llama3_style.json", merges_as_strings=False)

    split_only = pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False)
    cases = []
    for s in CASES:
        pieces = regex.findall(LLAMA3_PATTERN, s)
        assert "".join(pieces) == s, s
        lib_pieces = [p for p, _ in split_only.pre_tokenize_str(s)]
        assert lib_pieces == pieces, (s, lib_pieces, pieces)
        case = {"text": s, "llama3_pieces": pieces}
        for name, tok in (("gpt2_style", gpt2), ("llama3_style", llama3)):
            ids = tok.encode(s, add_special_tokens=False).ids
            assert tok.decode(ids, skip_special_tokens=False) == s, (name, s)
            case[name] = ids
        cases.append(case)
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": __import__("tokenizers").__version__, "cases": cases}, f,
                  ensure_ascii=True, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases; vocab {gpt2.get_vocab_size()} and {llama3.get_vocab_size()}")


if __name__ == "__main__":
    main(sys.argv)
