#pragma once
// The one stream of each device. Every kernel and copy on a device goes on its
// stream, in order, so a buffer freed on the host can be handed to the next
// launch at once: whatever still reads it was queued earlier. Only code that
// launches (cuda/*.cu and the bridges in cuda/bridge/) includes this header.
#include <cuda_runtime.h>

namespace attograd::cuda {

// Makes `device` current on the calling thread and returns its stream
// (created non-blocking on first use, so it never syncs with the legacy default stream).
cudaStream_t stream(int device);

}  // namespace attograd::cuda
