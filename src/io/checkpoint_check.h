// A checkpoint checked against its config from the safetensors headers
// alone (`dsv4 info`): every tensor the config needs is present, under its
// official name or an older spelling (Checkpoint::resolve), with a dtype the
// loader accepts and the expected shape.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"

namespace dsv4 {

// The dtypes the loader accepts for a tensor synthetic checkpoints write as
// `s`: norm vectors and the gate bias may be BF16 or F32, packed FP4 I8 or
// U8, tid2eid I64 or I32.
std::vector<DType> accepted_dtypes(const TensorSpec& s);

// The problems, one line each (empty: the checkpoint fits the config);
// *used gets the checkpoint names that were matched.
std::vector<std::string> check_checkpoint(const Checkpoint& ck, const ModelConfig& c, std::set<std::string>* used);

}  // namespace dsv4
