#include "train/distributed/launcher.h"

#include <cstdlib>
#include <initializer_list>
#include <string>

namespace attograd::train::distributed {

namespace {

int first_set(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (const char* value = std::getenv(name)) {
      try {
        return std::stoi(value);
      } catch (...) {
        return 0;
      }
    }
  return 0;
}

}  // namespace

int launcher_world_size() { return first_set({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}); }
int launcher_rank() { return first_set({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}); }

bool launcher_speaks() {
  const int processes = launcher_world_size(), rank = launcher_rank();
  return processes <= 1 || rank <= 0 || rank >= processes;
}

}  // namespace attograd::train::distributed
