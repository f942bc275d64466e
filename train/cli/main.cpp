// The attograd program: `attograd train | sample | eval | attention`, see train/cli/cli.cpp.
#include <string>
#include <vector>

#include "train/cli/cli.h"

int main(int argc, char** argv) {
  return attograd::train::cli::run_cli(std::vector<std::string>(argv + 1, argv + argc));
}
