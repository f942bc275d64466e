#!/usr/bin/env python3
"""attograd's GPT-2 folders against transformers' own GPT2LMHeadModel. Not run
in CI: it needs torch and transformers, a few GB, in a venv of their own:

    python3 -m venv /opt/torch2 && /opt/torch2/bin/pip install torch transformers

Three steps, the middle one attograd's test:

    python hf_transformers_check.py make DIR [--shape tiny|gpt2] [--untied]
    ATTOGRAD_HF_REFERENCE=DIR build-release/tests/attograd_tests "[transformers]"
    python hf_transformers_check.py verify-export DIR

make      builds GPT2LMHeadModel at random init (seeded; biases and LayerNorms
          drawn too, so none of them sits at 0 or 1; the tiny one's weights
          all N(0, 0.3), so that its greedy tokens vary) for a tiny config
          (2 layers, 4 heads, 32 wide, 16 positions, vocabulary 100) or GPT-2
          124M's shape (--shape gpt2), its head tied to wte or not (--untied),
          and writes
            DIR/hf/            save_pretrained, safetensors
            DIR/reference.json {"tokens": prompt ids, "continuation": the next
                               ids by greedy decoding, "shape": [T, V]}
            DIR/logits.f32     the prompt's logits, float32 little-endian (T, V)
          The test reads DIR/hf with read_hf_gpt2, compares its logits (within
          1e-5 of the largest) and greedy continuation, and writes DIR/export
          with write_hf_gpt2.
verify-export
          loads DIR/export with GPT2LMHeadModel.from_pretrained, checks that no
          key was missing, unexpected or mis-shaped, that every weight equals
          DIR/hf's, that a tied head is tied, and that its logits are
          DIR/logits.f32. Prints the figures; exit status 1 on a difference.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

SHAPES = {
    "tiny": dict(n_layer=2, n_head=4, n_embd=32, n_positions=16, vocab_size=100, bos_token_id=None, eos_token_id=None),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257),
}
PROMPT = {"tiny": 8, "gpt2": 32}
NEW_TOKENS = 8


def logits_of(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()


def greedy(model, tokens, n):
    out = list(tokens)
    for _ in range(n):
        out.append(int(logits_of(model, out)[-1].argmax()))
    return out[len(tokens):]


def make(folder, shape, untied):
    torch.manual_seed(1234)
    config = GPT2Config(**SHAPES[shape], tie_word_embeddings=not untied)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if shape == "tiny":  # GPT-2's init at this width gives near-uniform logits: one token repeated
                p.copy_(torch.randn_like(p) * 0.3)
            elif name.endswith(".bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    generator = np.random.default_rng(5)
    tokens = [int(t) for t in generator.integers(0, config.vocab_size, PROMPT[shape])]
    logits = logits_of(model, tokens)
    continuation = greedy(model, tokens, NEW_TOKENS)
    try:
        model.save_pretrained(os.path.join(folder, "hf"), safe_serialization=True)
    except TypeError:  # transformers 5 writes safetensors only, without the argument
        model.save_pretrained(os.path.join(folder, "hf"))
    logits.astype("<f4").tofile(os.path.join(folder, "logits.f32"))
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump({"tokens": tokens, "continuation": continuation, "shape": list(logits.shape)}, f)
    print("made %s: %s, %d parameters, tokens %s, greedy continuation %s"
          % (folder, shape, sum(p.numel() for p in model.parameters()), tokens, continuation))


def verify_export(folder):
    with open(os.path.join(folder, "reference.json")) as f:
        ref = json.load(f)
    want = np.fromfile(os.path.join(folder, "logits.f32"), dtype="<f4").reshape(ref["shape"])
    original = GPT2LMHeadModel.from_pretrained(os.path.join(folder, "hf")).eval()
    exported, info = GPT2LMHeadModel.from_pretrained(os.path.join(folder, "export"), output_loading_info=True)
    exported.eval()
    problems = [f"{k}: {v}" for k, v in info.items() if v]
    theirs = dict(original.named_parameters())
    for name, p in exported.named_parameters():
        if not torch.equal(p, theirs[name]):
            problems.append(f"{name} differs from the folder transformers saved")
    if exported.config.tie_word_embeddings and \
            exported.lm_head.weight.data_ptr() != exported.transformer.wte.weight.data_ptr():
        problems.append("lm_head.weight is not tied to wte.weight")
    logits = logits_of(exported, ref["tokens"])
    error = float(np.abs(logits - want).max() / np.abs(want).max())
    print("export read by transformers %s: loading info %s, largest logit difference %.3g of the largest logit"
          % (__import__("transformers").__version__, info, error))
    if error > 1e-6:
        problems.append(f"logits differ by {error:.3g} of the largest")
    for p in problems:
        print("difference: " + p)
    return 1 if problems else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["make", "verify-export"])
    parser.add_argument("dir")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--untied", action="store_true", help="an lm_head of its own (tie_word_embeddings false)")
    args = parser.parse_args()
    if args.step == "make":
        os.makedirs(args.dir, exist_ok=True)
        make(args.dir, args.shape, args.untied)
        return 0
    return verify_export(args.dir)


if __name__ == "__main__":
    sys.exit(main())
