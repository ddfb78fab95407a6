// libFuzzer target 'safetensors_header' (see fuzz/targets.h and scripts/fuzz.sh).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsv4::fuzz::safetensors_header(data, size);
  return 0;
}
