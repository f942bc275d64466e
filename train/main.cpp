// The attograd program. Subcommands are added by the train issue; for now it
// answers --help and --version.
#include <cstdio>
#include <cstring>

#include "train/version.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("attograd %s\n", attograd::version());
      return 0;
    }
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf("attograd %s: a minimal reverse-mode autograd framework\nusage: attograd [--help] [--version]\n",
                  attograd::version());
      return 0;
    }
    std::fprintf(stderr, "attograd: unknown argument '%s' (try --help)\n", argv[i]);
    return 2;
  }
  std::printf("attograd %s\n", attograd::version());
  return 0;
}
