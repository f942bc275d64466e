#pragma once
// Float32 copies between tensors of any device and layout and host memory, for
// what travels over MPI (which reads host memory). The CPU's contiguous float32
// tensors (every parameter and gradient of a CPU run) are read and written in
// place.
#include <vector>

#include "nn/module.h"
#include "tensor/tensor.h"

namespace attograd::train::distributed {

bool host_contiguous(const Tensor& t);          // a CPU float32 tensor, contiguous
void read_floats(const Tensor& t, float* dst);  // t's numel() values, row-major
void write_floats(const Tensor& t, const float* src);
// Throws "[what] parameter 'x' is f64; ..." unless every parameter is float32, as what travels is.
void check_float32(const std::vector<nn::NamedParameter>& params, const char* what);

}  // namespace attograd::train::distributed
