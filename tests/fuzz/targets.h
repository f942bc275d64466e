#pragma once
// The fuzz targets' bodies, shared by the libFuzzer programs (fuzz_*.cpp) and
// by tests/test_reliability.cpp, which replays the seed corpus and every saved
// crash through exactly this code in every build.
//
// Each feeds one input to a loader that must treat it as untrusted. Refusing it
// with attograd::Error is correct; anything else is a bug: a crash, a sanitizer
// report, another exception (it escapes), a broken round trip (__builtin_trap).
#include <cstddef>
#include <cstdint>

namespace attograd::fuzz {

// The bytes of a checkpoint file, read as `attograd sample --ckpt` and `train
// --resume` read one: the safetensors layout, its metadata, the model it describes.
int checkpoint(const std::uint8_t* data, std::size_t size);

// A text file (`train --data`), or "<vocabulary JSON>\0<text>": a checkpoint's
// vocabulary and a file evaluated with it (`eval --data`).
int text(const std::uint8_t* data, std::size_t size);

// A token file (`train --data` on llm.c's shards or nanoGPT's .bin), read as
// both formats: what parses has every token readable.
int shard(const std::uint8_t* data, std::size_t size);

// GPT-2 tokenizer files (`--tokenizer DIR`), "<encoder.json>\0<vocab.bpe>\0<text>":
// what loads encodes the text and decodes it back to its bytes.
int tokenizer(const std::uint8_t* data, std::size_t size);

// A Hugging Face GPT-2 folder (`sample --ckpt DIR`, `train --init-from DIR`),
// "<config.json>\0<model.safetensors>": what loads is a model that runs a token.
int hf(const std::uint8_t* data, std::size_t size);

}  // namespace attograd::fuzz
