// libFuzzer target 'config' (see fuzz/targets.h and scripts/fuzz.sh).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsv4::fuzz::config(data, size);
  return 0;
}
