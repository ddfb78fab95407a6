// The engine's matrix product: C[m][n] = Σ_k A[m][k] · B[n][k], fp32.
//
// Reduction order (PREFILL.md §6): every output is one fp32 accumulator fed
// by fused multiply-adds in ascending k, whatever the blocking, the thread
// split or M. The fast path and gemm_reference therefore agree bit for bit.
//
// B is never stored whole: a PanelLoader writes 16 consecutive B rows into a
// packed panel [K][16] (rows past N as zeros), so weights in FP8/FP4/BF16
// are dequantised one panel at a time and attention keys are gathered.
#pragma once
#include <cstdint>
#include <functional>

namespace dsv4 {

constexpr int kGemmNR = 16;  // B rows per panel

// vdpbf16ps flushes subnormal inputs and results to zero; the fp32 chain
// keeps them. A bf16 value is m·2^(E−7) with m an integer, E its unbiased
// exponent, so a product of two is a multiple of 2^(Ea+Eb−14). When that is
// at least 2^−126 for the smallest exponents of the two operands, every
// product and every sum of them is a multiple of 2^−126: zero or normal,
// never subnormal, so nothing is flushed and both chains agree. In biased
// exponents (e = E + 127): ea + eb − 254 − 14 ≥ −126.
constexpr int kDotMinBiasedExponentSum = 142;

// Writes B rows [n0, n0 + 16) into panel[k * 16 + j] (zeros past N).
using PanelLoader = std::function<void(int64_t n0, float* panel)>;

// Optional, for the BF16 kernel (Isa::kAvx512Bf16): writes the same panel
// straight as bf16 pairs [ceil(K/2)][16] (gemm_micro.h), skipping the fp32
// panel. Returns false when it cannot give exact bf16 values (gemm then
// loads the fp32 panel and packs that); otherwise sets *min_exponent to a
// lower bound of the non-zero values' biased exponents.
using PairLoader = std::function<bool(int64_t n0, uint32_t* pairs, int* min_exponent)>;

// Optional, in place of a PairLoader: returns where panel n0's pairs
// already are (laid out as a PairLoader writes them), or null where they
// are not exact bf16 values (gemm then loads the fp32 panel). For operands
// packed once and multiplied many times (the indexer's rows).
using PairSource = std::function<const uint32_t*(int64_t n0, int* min_exponent)>;

struct GemmOut {
  float* c = nullptr;
  int64_t ldc = 0;
  bool bf16 = false;  // round each output to bf16
};

// Threads split the work by panels; results do not depend on the split.
void gemm(const float* A, int64_t lda, int64_t M, int64_t K, int64_t N, const PanelLoader& load, const GemmOut& out,
          bool parallel = true, const PairLoader* load_pairs = nullptr, const PairSource* pair_source = nullptr);

// Panels the BF16 dot-product kernel has taken since the process started
// (Isa::kAvx512Bf16): lets tests see that the path ran.
int64_t gemm_dot_panel_count();

// Plain loops with std::fma in ascending k: the definition gemm is tested against.
void gemm_reference(const float* A, int64_t lda, int64_t M, int64_t K, int64_t N, const PanelLoader& load,
                    const GemmOut& out);

// A loader for a row-major fp32 matrix B [N][K] with row stride ldb.
PanelLoader dense_rows_loader(const float* B, int64_t ldb, int64_t N, int64_t K);

// Pair loaders for B rows given by pointers (rows[n], n < N, K values each;
// null: a zero row) or row-major as above: one pass from the rows to bf16
// pairs, where the BF16 kernel runs (false elsewhere, and where a value is
// not exact).
bool gathered_rows_pairs(const float* const* rows, int64_t N, int64_t K, int64_t n0, uint32_t* pairs,
                         int* min_exponent);
PairLoader dense_rows_pair_loader(const float* B, int64_t ldb, int64_t N, int64_t K);

}  // namespace dsv4
