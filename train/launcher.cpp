#include "train/launcher.h"

#include <cstdlib>
#include <string>

namespace attograd::train {

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* value = std::getenv(name)) {
      try {
        return std::stoi(value);
      } catch (...) {
        return 0;
      }
    }
  return 0;
}

}  // namespace attograd::train
