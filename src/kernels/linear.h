// Linear layers y = x · Wᵀ over a weight kept in its checkpoint format
// (MODEL.md §3). Weights are never expanded whole: each output row is
// dequantised once per call into fp32 and reused for all M input rows.
#pragma once
#include <cstdint>

namespace dsv4 {

struct Weight {
  enum class Kind { kFP8, kFP4, kBF16, kF32 };
  Kind kind = Kind::kF32;
  int64_t out = 0, in = 0;
  const uint8_t* data = nullptr;   // [out][in] (FP4: [out][in/2] packed)
  const uint8_t* scale = nullptr;  // e8m0: FP8 [ceil(out/B)][ceil(in/B)], FP4 [out][in/32]
  int block = 128;                 // FP8 weight block size
  // Optional: a BF16 weight's rows (or, where gemv runs on AVX2, an FP8
  // weight's dequant_row values) packed once as gemm's bf16 pair panels,
  // [ceil(out/16)][in/2][16] dwords (panel p, pair j, lane i = row 16p + i,
  // k = 2j in the high half, 2j + 1 in the low half; rows past `out` zero),
  // made by pack_pair_panels (kernels/gemv.h). gemv then reads 16 rows as
  // one stream, without transposing them; nothing else reads them. pair_min_exponent:
  // the smallest biased exponent of the non-zero values, or kNoPairDot
  // where a value is subnormal, infinite or NaN (vdpbf16ps would flush or
  // could differ).
  const uint32_t* pair_panels = nullptr;
  int pair_min_exponent = kNoPairDot;
  static constexpr int kNoPairDot = -1000;
  // Optional, FP4 only: the codes and scales repacked once as 16-row
  // panels by pack_quant_panels (kernels/gemv.h), which gemv's vdpbf16ps
  // and AVX2 tiles and the gemm's decoders read as one stream per 16 rows,
  // with no transposing (vdpbf16ps: one shift per pair vector). fp4_panels:
  // [ceil(out/16)][in/8][16] dwords, lane i of panel p and step q holding
  // the codes of k in [8q, 8q + 8) of row 16p + i: the odd k's in the low
  // half (k = 8q + 1 in bits 0-3, 8q + 3 in bits 4-7, ...), the even k's
  // in the high half (8q in bits 16-19, ...). fp4_panel_scales:
  // [ceil(out/16)][in/32][16] e8m0 codes. Rows past `out` have zero codes
  // and the scales of the panel's first row.
  const uint32_t* fp4_panels = nullptr;
  const uint8_t* fp4_panel_scales = nullptr;
  // Optional, FP8 only: the codes repacked once as 16-row panels by
  // pack_quant_panels, read the same way: [ceil(out/16)][in/4][16] dwords,
  // lane i of panel p and step q holding the codes of k = 4q .. 4q + 3 of
  // row 16p + i in the byte order 4q + 1, 4q + 3, 4q, 4q + 2 (each word
  // then holds one pair's code at the bottom and the next pair's above it).
  // Rows past `out` have zero codes. The scales stay those of `scale`: a
  // panel's 16 rows lie in one scale block.
  const uint32_t* fp8_panels = nullptr;

  // Bytes of one stored row (without its scales).
  int64_t row_bytes() const;
  // Writes row o of the dequantised weight (in values) to dst.
  void dequant_row(int64_t o, float* dst) const;
  // Writes rows [o0, o0 + 16) as a gemm panel, panel[k·16 + j] = W[o0 + j][k],
  // zeros for rows at or past o_end. The AVX2 path converts 8 values of a
  // row at once and transposes in registers; it equals dequant_row exactly.
  void dequant_panel(int64_t o0, int64_t o_end, float* panel) const;
  // The same panel as bf16 pairs for the BF16 gemm kernel (gemm.h
  // PairLoader); false where this kind or CPU has no such decoder or the
  // values are not all normal bf16 values.
  bool dequant_panel_pairs(int64_t o0, int64_t o_end, uint32_t* pairs, int* min_exponent) const;
  // The same through dequant_row, value by value: what the test compares to.
  void dequant_panel_reference(int64_t o0, int64_t o_end, float* panel) const;
};

struct LinearOpts {
  bool act_quant = false;   // FP8-quantise each input row in blocks of act_block first
  int act_block = 128;
  bool act_pow2 = true;     // power-of-two activation scales (scale_fmt ue8m0)
  bool out_bf16 = true;     // round each output to bf16
};

// y[m][o - row_begin] = Σ_i x[m][i] · W[o][i] for o in [row_begin, row_end),
// x rows of length W.in with stride ldx, y with stride ldy.
void linear(const Weight& w, const float* x, int64_t M, float* y, const LinearOpts& opts,
            int64_t row_begin = 0, int64_t row_end = -1, int64_t ldx = -1, int64_t ldy = -1);

// out[m][·] = x row m FP8-quantised as linear does with opts.act_quant (rows
// of K values, x with stride ldx, out dense): for several linears of one input.
void act_quant_rows(const float* x, int64_t M, int64_t K, int64_t ldx, const LinearOpts& opts, float* out);

// Options for the FP8/FP4 linears of MODEL.md §3 (activation FP8, bf16 out).
LinearOpts quant_linear_opts(int act_block, bool pow2);

}  // namespace dsv4
