#pragma once
// What an MPI launcher (mpirun, mpiexec, srun) tells the processes it starts,
// through their environment, before any MPI call.
namespace attograd::train::distributed {

// The number of processes the launcher started (OMPI_COMM_WORLD_SIZE, PMI_SIZE
// or PMIX_SIZE), or 0 when this process was not started by one.
int launcher_world_size();
// This process's rank among them (OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK), or 0.
int launcher_rank();
// Whether this process speaks for the launch, before any MPI call: rank 0 of
// several, or any process a launcher did not start as one of several. A stray
// rank variable (left in a shell, say) must not silence an error.
bool launcher_speaks();

}  // namespace attograd::train::distributed
