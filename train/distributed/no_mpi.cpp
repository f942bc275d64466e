// A build without MPI: every run is one process. Started by mpirun as one of
// several, each process would silently train alone on the whole batch and
// overwrite the others' checkpoints, so that is an error.
#include <cstdlib>

#include "base/error.h"
#include "train/distributed/communicator.h"
#include "train/distributed/launcher.h"

namespace attograd::train::distributed {

bool built_with_mpi() { return false; }

std::unique_ptr<Communicator> make_communicator() {
  const int processes = launcher_world_size();
  AG_CHECK(processes <= 1, "mpirun",
           "started as one of {} processes, but this attograd was built without MPI "
           "(install libopenmpi-dev and configure with -DATTOGRAD_MPI=ON)",
           processes);
  return single_process_communicator();
}

}  // namespace attograd::train::distributed
