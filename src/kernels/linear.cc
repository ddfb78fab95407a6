#include "kernels/linear.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/formats.h"
#include "core/thread_pool.h"
#include "kernels/gemm.h"

namespace dsv4 {

void Weight::dequant_row(int64_t o, float* dst) const {
  switch (kind) {
    case Kind::kF32: {
      std::memcpy(dst, data + 4 * o * in, size_t(in) * 4);
      break;
    }
    case Kind::kBF16: {
      const uint8_t* r = data + 2 * o * in;  // mapped data need not be 2-byte aligned
      for (int64_t i = 0; i < in; ++i) {
        uint16_t h;
        std::memcpy(&h, r + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      break;
    }
    case Kind::kFP8: {
      const float* lut = e4m3_table();
      const uint8_t* r = data + o * in;
      int64_t scols = (in + block - 1) / block;
      const uint8_t* srow = scale + (o / block) * scols;
      for (int64_t b = 0; b < scols; ++b) {
        float s = e8m0_to_f32(srow[b]);
        int64_t i1 = std::min(in, (b + 1) * block);
        for (int64_t i = b * block; i < i1; ++i) dst[i] = lut[r[i]] * s;
      }
      break;
    }
    case Kind::kFP4: {
      // One table lookup per byte gives both values (low nibble: even index).
      static const std::array<std::array<float, 2>, 256> pairs = [] {
        std::array<std::array<float, 2>, 256> t{};
        for (int b = 0; b < 256; ++b) t[size_t(b)] = {e2m1_to_f32(uint8_t(b & 15)), e2m1_to_f32(uint8_t(b >> 4))};
        return t;
      }();
      const uint8_t* r = data + o * (in / 2);
      const uint8_t* srow = scale + o * (in / 32);
      for (int64_t b = 0; b < in / 32; ++b) {
        const float s = e8m0_to_f32(srow[b]);  // a power of two: the products are exact
        for (int64_t j = 0; j < 16; ++j) {
          const auto& v = pairs[r[b * 16 + j]];
          dst[b * 32 + 2 * j] = v[0] * s;
          dst[b * 32 + 2 * j + 1] = v[1] * s;
        }
      }
      break;
    }
  }
}

Weight load_weight(const Checkpoint& ck, const std::string& prefix, Weight::Kind kind, int64_t out, int64_t in,
                   int block) {
  Weight w;
  w.kind = kind;
  w.out = out;
  w.in = in;
  w.block = block;
  const std::string wn = prefix + ".weight";
  auto scale_name = [&]() {
    std::string s = prefix + ".scale";
    if (!ck.has(s) && ck.has(prefix + ".weight_scale_inv")) s = prefix + ".weight_scale_inv";
    return s;
  };
  switch (kind) {
    case Weight::Kind::kF32:
      w.data = ck.get(wn, DType::kF32, {out, in}).data;
      break;
    case Weight::Kind::kBF16:
      w.data = ck.get(wn, DType::kBF16, {out, in}).data;
      break;
    case Weight::Kind::kFP8:
      w.data = ck.get(wn, DType::kF8E4M3, {out, in}).data;
      w.scale = ck.get(scale_name(), DType::kF8E8M0, {(out + block - 1) / block, (in + block - 1) / block}).data;
      break;
    case Weight::Kind::kFP4:
      if (in % 32 != 0) throw Error(wn + ": FP4 input width " + std::to_string(in) + " is not a multiple of 32");
      w.data = ck.get_any(wn, {DType::kI8, DType::kU8}, {out, in / 2}).data;
      w.scale = ck.get(scale_name(), DType::kF8E8M0, {out, in / 32}).data;
      break;
  }
  return w;
}

LinearOpts quant_linear_opts(int act_block, bool pow2) {
  LinearOpts o;
  o.act_quant = true;
  o.act_block = act_block;
  o.act_pow2 = pow2;
  o.out_bf16 = true;
  return o;
}

void linear(const Weight& w, const float* x, int64_t M, float* y, const LinearOpts& opts, int64_t row_begin,
            int64_t row_end, int64_t ldx, int64_t ldy) {
  if (row_end < 0) row_end = w.out;
  if (ldx < 0) ldx = w.in;
  if (ldy < 0) ldy = row_end - row_begin;
  const int64_t K = w.in;
  std::vector<float> xq;
  if (opts.act_quant) {
    xq.resize(size_t(M * K));
    for (int64_t m = 0; m < M; ++m) {
      std::copy(x + m * ldx, x + m * ldx + K, xq.begin() + m * K);
      q8_inplace(xq.data() + m * K, size_t(K), size_t(opts.act_block), opts.act_pow2);
    }
    x = xq.data();
    ldx = K;
  }
  // Panels of 16 weight rows are dequantised on the fly; gemm fixes the
  // reduction order (one FMA chain per output, ascending k).
  const int64_t rows = row_end - row_begin;
  auto load = [&](int64_t n0, float* panel) {
    thread_local std::vector<float> row;
    row.resize(size_t(K));
    for (int j = 0; j < kGemmNR; ++j) {
      const int64_t o = row_begin + n0 + j;
      if (o < row_end) {
        w.dequant_row(o, row.data());
        for (int64_t k = 0; k < K; ++k) panel[k * kGemmNR + j] = row[size_t(k)];
      } else {
        for (int64_t k = 0; k < K; ++k) panel[k * kGemmNR + j] = 0.f;
      }
    }
  };
  gemm(x, ldx, M, K, rows, load, GemmOut{y, ldy, opts.out_bf16});
}

}  // namespace dsv4
