#pragma once
// train/output/: every file a run writes, and reading checkpoints back
// (namespace attograd::train::output). Each file is replaced atomically
// (train/files.h), so a crash leaves the previous one whole.
//   checkpoint.h     a run's checkpoint: parameters, optimizer state, step, config, vocabulary
//   safetensors.h    the safetensors layout the checkpoint is written in, so PyTorch reads it
//   run_directory.h  the run directory (--out): checked first, created last, locked, numbered
//   metrics.h        metrics.jsonl: a record per step and per evaluation
//   svg.h            loss.svg and attention.svg
//   hf_gpt2.h        GPT-2 weights in Hugging Face's layout (config.json, model.safetensors), in and out
#include "train/output/checkpoint.h"
#include "train/output/hf_gpt2.h"
#include "train/output/metrics.h"
#include "train/output/run_directory.h"
#include "train/output/safetensors.h"
#include "train/output/svg.h"
