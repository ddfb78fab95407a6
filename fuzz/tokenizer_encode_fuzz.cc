// libFuzzer target 'tokenizer_encode' (see fuzz/targets.h and scripts/fuzz.sh).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dsv4::fuzz::tokenizer_encode(data, size);
  return 0;
}
