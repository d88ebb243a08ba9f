"""What scripts/bench/gpt2_tessera_cuda.py and gpt2_torch_cuda.py share (standard library only):
the models and the order in which the runs go."""

MODELS = {  # name: (n_layer, n_head, n_embd, vocab)
    "gpt2-124m": (12, 12, 768, 50257),
    "gpt2-350m": (24, 16, 1024, 50257),
    "tiny": (2, 2, 64, 512),  # --tiny: the CPU rehearsal of the scripts' logic
}


def parse_batches(text):
    """'8 16 32' or '8,16,32' -> [8, 16, 32]."""
    return [int(b) for b in text.replace(",", " ").split()]


def batches_of(args):
    """The (model, [B, ...]) list of --batches-124m and --batches-350m, or --tiny's (T set to 64)."""
    if args.tiny:
        args.seq = 64
        return [("tiny", [2, 4])]
    return [("gpt2-124m", parse_batches(args.batches_124m)), ("gpt2-350m", parse_batches(args.batches_350m))]


def run_order(batches):
    """(model, B) pairs, most wanted first: each model's middle micro-batch, then the others, so
    that a deadline cuts the least useful runs. batches: [(model, [B, ...]), ...]."""
    firsts, rest = [], []
    for model, bs in batches:
        mid = bs[len(bs) // 2]
        firsts.append((model, mid))
        rest += [(model, b) for b in bs if b != mid]
    return firsts + rest
