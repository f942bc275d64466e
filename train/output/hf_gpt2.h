#pragma once
// GPT-2 weights in Hugging Face's layout, in and out: a folder that
// transformers' GPT2LMHeadModel.from_pretrained reads and save_pretrained
// writes, holding
//   config.json        GPT2Config: n_layer, n_head, n_embd, n_positions (or the
//                      older n_ctx), vocab_size, tie_word_embeddings, ...
//   model.safetensors  float32 tensors named "transformer.h.0.attn.c_attn.weight",
//                      ... (the "transformer." prefix is optional on reading);
//                      c_attn, c_proj, c_fc and mlp.c_proj are Conv1D weights,
//                      stored (in, out), where attograd's Linear is (out, in)
// attograd's GPT (nn/gpt.h) computes what GPT2LMHeadModel computes for the
// configurations read here: gelu_new, LayerNorm eps 1e-5, attention scaled by
// 1/sqrt(head size), q|k|v in c_attn's columns in that order, heads side by side.
//
// A folder is untrusted input. read_hf_gpt2 refuses, in one line naming the file
// and the key or tensor ("[dir/config.json] activation_function is \"relu\" ..."):
//   - a config it cannot honour: activation_function other than gelu_new (or
//     gelu_pytorch_tanh, the same function), layer_norm_epsilon other than 1e-5,
//     scale_attn_weights false, scale_attn_by_inverse_layer_idx,
//     reorder_and_upcast_attn or add_cross_attention true, n_inner other than
//     null or 4 n_embd, n_embd not a multiple of n_head, sizes that are not
//     positive integers below 2^31;
//   - a missing tensor, an unexpected one, a shape other than the config's,
//     a dtype other than F32, F16 or BF16 (both widened to float32);
//   - an lm_head.weight that differs from wte.weight while tie_word_embeddings
//     is true (transformers would tie them and drop it), or none while it is false.
// The buffers attn.bias and attn.masked_bias (the causal mask older
// transformers saved) are skipped. A sharded checkpoint
// (model.safetensors.index.json) and pytorch_model.bin are not read.
#include <cstdint>
#include <string>
#include <string_view>

#include "nn/gpt.h"

namespace attograd::train::output {

struct HfGpt2 {
  // vocab_size, block_size (n_positions), n_layer, n_head, n_embd and
  // tie_weights from the folder, dropout its resid/embd/attn_pdrop where the
  // three agree (else 0); bias true as nn's default.
  nn::GPTConfig config;
  // attograd's names and layouts ("blocks.0.attn.qkv.weight", (3C, C)),
  // float32 on the CPU: nn::GPT(config).load_state_dict(state) takes it as it is.
  nn::StateDict state;
};

HfGpt2 read_hf_gpt2(const std::string& dir);
// The same from the two files' contents; `where` stands for the folder in errors.
HfGpt2 parse_hf_gpt2(std::string_view config_json, std::string_view safetensors, const std::string& where);

struct HfExportOptions {
  // The vocabulary to write, at most the model's: a model whose embedding has
  // rows padded past its tokenizer (50304 for GPT-2's 50257) writes the first
  // vocab_size rows of wte and lm_head. 0: the model's whole vocabulary.
  std::int64_t vocab_size = 0;
};

// Writes dir/model.safetensors and dir/config.json (creating dir), each
// atomically; the same model gives the same bytes. A tied model writes no
// lm_head.weight, as save_pretrained does, and tie_word_embeddings true.
// Refuses a model without biases (GPT-2 has them everywhere).
void write_hf_gpt2(const std::string& dir, const nn::GPT& model, const HfExportOptions& options = {});

}  // namespace attograd::train::output
