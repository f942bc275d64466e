#pragma once
// train/data/: what the model reads (namespace attograd::train::data).
//   dataset.h    the Dataset interface: training batches that are a pure function of
//                (seed, step), a fixed held-out set; make_dataset, the task or text a run names
//   text_data.h  character-level language modelling on a UTF-8 text file (--data)
//   tasks.h      the synthetic tasks: sort, reverse, copy, add (--task)
//   tokenizer.h  one token per Unicode code point, kept in checkpoints as JSON
//   utf8.h       UTF-8 to code points and back, errors naming the byte offset
#include "train/data/dataset.h"
#include "train/data/tasks.h"
#include "train/data/text_data.h"
#include "train/data/tokenizer.h"
#include "train/data/utf8.h"
