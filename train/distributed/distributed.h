#pragma once
// train/distributed/: data parallelism, owned by the program, not the model
// (namespace attograd::train::distributed). nn/, autograd/ and tensor/ know
// nothing of processes.
//   communicator.h       the processes of one run: Open MPI (mpi_communicator.cpp), one
//                        process (no_mpi.cpp), and NCCL between GPUs (nccl_communicator.cpp)
//   launcher.h           what mpirun tells its processes through their environment
//   data_parallel.h      gradients summed in buckets as backward produces them (as DDP);
//                        rank 0's weights broadcast; parameter checksums
//   step.h               one step's loss and gradients on this process's share (--grad-accum)
//   fixed_split.h        --fixed-split: the same bits on any process count dividing it
//   sharded_optimizer.h  --shard-optimizer: ZeRO stage 1
//   host_floats.h        float32 copies between tensors and host memory, for MPI
#include "train/distributed/communicator.h"
#include "train/distributed/data_parallel.h"
#include "train/distributed/fixed_split.h"
#include "train/distributed/host_floats.h"
#include "train/distributed/launcher.h"
#include "train/distributed/sharded_optimizer.h"
#include "train/distributed/step.h"
