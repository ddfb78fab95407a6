// libFuzzer target 'checkpoint_index' (see fuzz/targets.h and scripts/fuzz.sh).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsv4::fuzz::checkpoint_index(data, size);
  return 0;
}
