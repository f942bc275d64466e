#!/usr/bin/env python3
"""GPT-2's forward in numpy alone, from a Hugging Face folder: the yardstick the
[hf] tests hold attograd's logits to (tests/test_hf_gpt2.cpp).

    gpt2_numpy.py FOLDER IDS OUT

FOLDER holds config.json and model.safetensors (float32, with or without the
"transformer." prefix, lm_head.weight optional when tied). IDS is a JSON file
{"tokens": [t0, t1, ...]}: one sequence, no longer than n_positions. OUT gets
JSON {"logits": [[...] per position], "loss": mean cross-entropy of predicting
tokens[1:] from tokens[:-1]}. Everything is computed in float64, following
transformers' GPT2LMHeadModel: pre-LayerNorm blocks (eps from the config),
Conv1D weights stored (in, out), q|k|v in c_attn's columns, heads side by side,
attention scaled by 1/sqrt(head size), gelu_new.

The safetensors file is read here with json and numpy only: 8 bytes of header
length (little-endian), the JSON header, then the raw tensors.
Exit status 2 (and a line on stderr) when numpy is missing.
"""
import json
import math
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed in " + sys.executable, file=sys.stderr)
    sys.exit(2)

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(body[begin:end], dtype=np.dtype(DTYPES[info["dtype"]]).newbyteorder("<"))
        tensors[name.removeprefix("transformer.")] = array.reshape(info["shape"]).astype(np.float64)
    return tensors


def layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(x, w, prefix, n_head):
    t, c = x.shape
    d = c // n_head
    qkv = x @ w[prefix + "c_attn.weight"] + w[prefix + "c_attn.bias"]  # (T, 3C)
    q, k, v = (qkv[:, i * c:(i + 1) * c].reshape(t, n_head, d).transpose(1, 0, 2) for i in range(3))  # (H, T, D)
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)  # (H, T, T)
    scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    y = (probs @ v).transpose(1, 0, 2).reshape(t, c)
    return y @ w[prefix + "c_proj.weight"] + w[prefix + "c_proj.bias"]


def forward(config, w, tokens):
    eps = config.get("layer_norm_epsilon", 1e-5)
    x = w["wte.weight"][tokens] + w["wpe.weight"][np.arange(len(tokens))]
    for i in range(config["n_layer"]):
        p = "h.%d." % i
        x = x + attention(layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps), w, p + "attn.", config["n_head"])
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    return x @ w.get("lm_head.weight", w["wte.weight"]).T  # (T, V)


def mean_loss(logits, tokens):
    z = logits[:-1]
    log_probs = z - z.max(-1, keepdims=True)
    log_probs = log_probs - np.log(np.exp(log_probs).sum(-1, keepdims=True))
    return float(-log_probs[np.arange(len(tokens) - 1), tokens[1:]].mean())


def main():
    folder, ids_path, out_path = sys.argv[1:4]
    with open(folder + "/config.json") as f:
        config = json.load(f)
    weights = read_safetensors(folder + "/model.safetensors")
    with open(ids_path) as f:
        tokens = np.array(json.load(f)["tokens"], dtype=np.int64)
    logits = forward(config, weights, tokens)
    with open(out_path, "w") as f:
        json.dump({"logits": logits.tolist(), "loss": mean_loss(logits, tokens)}, f)


if __name__ == "__main__":
    main()
