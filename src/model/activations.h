// The activation buffers of the model's forward functions. The caller owns
// them and passes them down by reference: the engine keeps one
// LayerActivations per batch and reuses it across layers and calls. Each
// module declares its own part beside its functions (AttentionActivations in
// model/attention.h, MoeActivations in model/moe.h, ...); this header groups
// them.
//
// A buffer grows to the largest size asked of it and stays (core/scratch.h
// scratch(vec, n)): a fresh block per call would be zero-filled and, over
// glibc's mmap threshold, mapped and faulted in anew every time. A function writes
// every element it reads. Temporaries of the tasks of a parallel loop come
// from a per-worker array (model/workers.h worker_slots), indexed by the
// worker id that ThreadPool::parallel_for passes.
#pragma once
#include <vector>

#include "model/attention.h"
#include "model/hc.h"
#include "model/moe.h"

namespace dsv4 {

// One layer's activations over the rows of a batch step.
struct LayerActivations {
  std::vector<float> y, f;  // sublayer input and output [rows][D]
  AttentionActivations attention;
  MoeActivations moe;
  HcActivations hc;
};

}  // namespace dsv4
