#pragma once
// --fixed-split S: a step's gradients that are the same bits on any process
// count that divides S.
//
// A float sum's bits depend on the order of its additions, and a batch split
// over N processes adds its gradients in an order that depends on N: each
// process's products sum its own rows, then the all-reduce adds the processes'
// sums in whatever order MPI's schedule picks. Training amplifies the
// difference (about 1e-5 relative in the loss after 100 steps: README,
// "Scaling out"). Here instead every step is S pieces of the batch (S a power
// of two; piece p is the same rows whatever N is), each piece's gradients are
// computed alone, and the S are summed in one perfect binary tree:
// ((g0 + g1) + (g2 + g3)) + ((g4 + g5) + (g6 + g7)). Process r computes pieces
// [r S/N, (r+1) S/N), the subtree below it; the levels above it are recursive
// doubling across processes (at distance 1, 2, 4, ... each process adds its
// partner's partial sum to its own, and a + b is b + a in floats). One process
// runs the whole tree itself. Every leaf and every addition being the same,
// so is the sum, and so is the run, given the same --threads per process.
//
// Dropout draws piece p's masks from its own span of the Philox stream, so
// runs with --dropout are the same bits too.
//
// The price: no overlap of communication with backward (the tree waits for the
// last piece), log2 N exchanges of the whole gradient where a ring all-reduce
// moves 2(N-1)/N of it, and S smaller backward passes a step.
#include <cstdint>
#include <vector>

#include "nn/gpt.h"
#include "train/data/dataset.h"
#include "train/distributed/communicator.h"
#include "train/distributed/step.h"

namespace attograd::train::distributed {

// Sums equal-length float vectors, given one at a time, in the order of a
// perfect binary tree over them: the first two, the next two, then those two
// sums, and so on (a binary counter of partial sums: log2 of them wait at once).
class PairwiseSum {
 public:
  void add(std::vector<float> values);
  // The sum of the vectors added since the last take(); their count must be a power of two.
  std::vector<float> take();

 private:
  std::vector<std::vector<float>> waiting_;  // waiting_[l]: the sum of 2^l vectors, held while bit l of count_ is set
  std::uint64_t count_ = 0;
};

// The levels of the tree above the processes: each process's `values` (its
// subtree's sum) becomes the sum over every process, added in the tree's order.
// comm.size() must be a power of two.
void sum_over_processes_in_tree(std::vector<float>& values, Communicator& comm);

// One training step's loss and gradients as described above, left in every
// parameter's .grad on every process (as step.h's compute_gradients).
StepGradients fixed_split_gradients(nn::GPT& model, const data::Batch& batch, const StepCompute& at, std::int64_t pieces,
                                    Communicator& comm);

}  // namespace attograd::train::distributed
