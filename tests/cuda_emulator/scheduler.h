#pragma once
// What the emulator's mbarriers (mbarrier.cpp) ask of the block runner
// (emulator.cpp), and what the runner asks of them.
#include <cstddef>

namespace emu {

namespace scheduler {
// The worker (fiber) running the current thread.
std::size_t current_worker();
// The current thread waits until another one resumes its worker; the block's
// other threads run meanwhile. If none can go on, the launch stops, naming `where`.
void suspend(const char* where);
void resume(std::size_t worker);
// ATTOGRAD_EMULATED_ORDER=reverse: the block's last warp runs ahead, and
// asynchronous work is made at once rather than when waited for.
bool last_warp_ahead();
}  // namespace scheduler

// A new block's shared memory holds no mbarrier (called as each block starts).
void forget_mbarriers();

}  // namespace emu
