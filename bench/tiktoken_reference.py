#!/usr/bin/env python3
"""tiktoken's side of bench/bench_tokenizer.cpp: encode_ordinary_batch of the same documents (the text
of ATTOGRAD_BENCH_TEXT split at blank lines) with GPT-2's encoding built from the files
tests/reference/gpt2_tokenizer.py checks, on ATTOGRAD_THREADS threads (default 2); the median of 5
timings after a warm-up, as MB/s of text and tokens/s.

    ATTOGRAD_BENCH_TEXT=corpus.txt ATTOGRAD_THREADS=2 /opt/attograd-reference/bin/python3 bench/tiktoken_reference.py
"""
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "reference"))
import gpt2_tokenizer  # noqa: E402

text = pathlib.Path(os.environ["ATTOGRAD_BENCH_TEXT"]).read_text(encoding="utf-8")
threads = int(os.environ.get("ATTOGRAD_THREADS", "2"))
docs = text.split("\n\n")
enc = gpt2_tokenizer.encoding(gpt2_tokenizer.folder())
tokens = sum(map(len, enc.encode_ordinary_batch(docs, num_threads=threads)))
times = []
for _ in range(5):
    start = time.perf_counter()
    enc.encode_ordinary_batch(docs, num_threads=threads)
    times.append(time.perf_counter() - start)
t = statistics.median(times)
print(f"tiktoken encode_ordinary_batch, {threads} threads: {t * 1e3:.1f} ms, "
      f"{len(text.encode()) / t / 1e6:.2f} MB/s, {tokens / t / 1e6:.3f} M tokens/s ({tokens} tokens, {len(docs)} docs)")
