// Sparse MoE expert FFN for XLA:CPU, as an XLA FFI custom call.
//
// y[n] = sum_j w[n, j] * FFN_{idx[n, j]}(x[n]): only the (token, expert)
// pairs the router chose are computed, each expert's weights are read once
// for every 64 of its tokens, and the work is split over XLA's intra-op
// thread pool in (expert, 64 rows) units.
//
// Why: XLA:CPU runs the sampler's [16..64, D] @ [D, E*F] matmuls at a small
// fraction of the machine's bandwidth and computes every expert on every
// token; this kernel is register-blocked for few rows. Built at first use by
// cascade_jax/kernels/_build.py with the host compiler (-O3 -march=native);
// portable C++ with GCC/Clang vector extensions (no intrinsics).

#include <vector>

#include "cpu_common.h"

namespace ffi = xla::ffi;

namespace cascade_jax {
namespace {

// A register block: kRows x kNB accumulators, kNB vectors of w, one of x
// (AVX-512: 6 x 4 of 16 floats, 29 of 32 registers; AVX2: 6 x 2 of 8, 15
// of 16).
constexpr int kNB = kRegisterVectors >= 32 ? 4 : 2;  // vectors a column block
constexpr int64_t kCols = kV * kNB;   // columns per block (64; AVX2: 16)
constexpr int kRows = 6;              // rows per register block
constexpr int kPrefetch = 16;         // k-steps ahead

// c[R, kCols] = x[R, K] @ w[K, kCols] (row strides ldx, ldw, ldc).
template <int R, bool kFetch>
void Block(const float* x, int64_t ldx, const float* w, int64_t ldw,
           int64_t k_dim, float* c, int64_t ldc) {
  vf acc[R][kNB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < kNB; ++j) acc[r][j] = vf{};
  for (int64_t k = 0; k < k_dim; ++k) {
    if (kFetch && k + kPrefetch < k_dim)
      for (int j = 0; j < kNB; ++j)
        __builtin_prefetch(w + (k + kPrefetch) * ldw + j * kV);
    vf b[kNB];
#pragma GCC unroll 4
    for (int j = 0; j < kNB; ++j) b[j] = Load(w + k * ldw + j * kV);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vf a = Splat(x[r * ldx + k]);
#pragma GCC unroll 4
      for (int j = 0; j < kNB; ++j) acc[r][j] += a * b[j];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < kNB; ++j) Store(c + r * ldc + j * kV, acc[r][j]);
}

// The same for a column tail narrower than kCols (small models).
void TailBlock(int64_t rows, const float* x, int64_t ldx, const float* w,
               int64_t ldw, int64_t k_dim, int64_t cols, float* c,
               int64_t ldc) {
  for (int64_t r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    for (int64_t j = 0; j < cols; ++j) cr[j] = 0.f;
    for (int64_t k = 0; k < k_dim; ++k) {
      const float a = x[r * ldx + k];
      const float* wk = w + k * ldw;
      for (int64_t j = 0; j < cols; ++j) cr[j] += a * wk[j];
    }
  }
}

// c[M, N] = x[M, K] @ w[K, N].
void Gemm(int64_t m, int64_t n, int64_t k_dim, const float* x, int64_t ldx,
          const float* w, int64_t ldw, float* c, int64_t ldc) {
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const float* wj = w + j0;
    float* cj = c + j0;
    if (n - j0 < kCols) {
      TailBlock(m, x, ldx, wj, ldw, k_dim, n - j0, cj, ldc);
      continue;
    }
    // The first row block streams this column block of w in (prefetching
    // ahead); the later ones find it in cache.
    int64_t r0 = 0;
    for (; r0 + kRows <= m; r0 += kRows) {
      if (r0 == 0)
        Block<kRows, true>(x, ldx, wj, ldw, k_dim, cj, ldc);
      else
        Block<kRows, false>(x + r0 * ldx, ldx, wj, ldw, k_dim,
                            cj + r0 * ldc, ldc);
    }
    const float* xr = x + r0 * ldx;
    float* cr = cj + r0 * ldc;
    switch (m - r0) {
      case 5: Block<5, true>(xr, ldx, wj, ldw, k_dim, cr, ldc); break;
      case 4: Block<4, true>(xr, ldx, wj, ldw, k_dim, cr, ldc); break;
      case 3: Block<3, true>(xr, ldx, wj, ldw, k_dim, cr, ldc); break;
      case 2: Block<2, true>(xr, ldx, wj, ldw, k_dim, cr, ldc); break;
      case 1: Block<1, true>(xr, ldx, wj, ldw, k_dim, cr, ldc); break;
      default: break;
    }
  }
}

enum Activation : int64_t { kSwiglu = 0, kRelu2 = 1 };

inline vf Swiglu(vf g, vf u) { return g / (Splat(1.f) + Exp(-g)) * u; }

// h = act(g, u) elementwise over `count` floats (in place into g).
void Activate(int64_t act, float* g, const float* u, int64_t count) {
  if (act == kRelu2) {
    for (int64_t i = 0; i < count; ++i) {
      const float a = g[i] > 0.f ? g[i] : 0.f;
      g[i] = a * a;
    }
    return;
  }
  int64_t i = 0;
  for (; i + kV <= count; i += kV) Store(g + i, Swiglu(Load(g + i), Load(u + i)));
  if (i < count) {  // the last count % kV floats, through a zero-padded vector
    float a[kV] = {}, b[kV] = {};
    const size_t bytes = (count - i) * sizeof(float);
    std::memcpy(a, g + i, bytes);
    std::memcpy(b, u + i, bytes);
    Store(a, Swiglu(Load(a), Load(b)));
    std::memcpy(g + i, a, bytes);
  }
}

struct Shapes {
  int64_t n, k, d, e, f;
};

constexpr int64_t kUnitRows = 64;  // rows of one expert per unit of work

// One unit: the whole FFN for up to 64 rows of expert e, starting at sorted
// row `first`; xs / ys [P, D] hold the (token, choice) pairs' rows sorted by
// expert.
void RunUnit(const Shapes& s, int64_t act, const float* wg, const float* wu,
             const float* wd, int64_t e, int64_t first, int64_t rows,
             const float* xs, float* ys) {
  thread_local std::vector<float> g, u;
  g.resize(rows * s.f);
  if (act == kSwiglu) u.resize(rows * s.f);
  const float* x = xs + first * s.d;
  Gemm(rows, s.f, s.d, x, s.d, wg + e * s.d * s.f, s.f, g.data(), s.f);
  if (act == kSwiglu)
    Gemm(rows, s.f, s.d, x, s.d, wu + e * s.d * s.f, s.f, u.data(), s.f);
  Activate(act, g.data(), u.data(), rows * s.f);
  Gemm(rows, s.d, s.f, g.data(), s.f, wd + e * s.f * s.d, s.d,
       ys + first * s.d, s.d);
}

ffi::Error MoeFfn(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                  ffi::Buffer<ffi::S32> idx, ffi::Buffer<ffi::F32> gate_w,
                  ffi::Buffer<ffi::F32> w_gate, ffi::Buffer<ffi::F32> w_up,
                  ffi::Buffer<ffi::F32> w_down, ffi::ResultBuffer<ffi::F32> y,
                  int64_t act) {
  auto xd = x.dimensions(), id = idx.dimensions(), gd = w_gate.dimensions(),
       dd = w_down.dimensions();
  if (xd.size() != 2 || id.size() != 2 || gd.size() != 3 || dd.size() != 3)
    return ffi::Error::InvalidArgument("moe_ffn: expects x [N, D], idx [N, k], "
                                       "w_gate [E, D, F], w_down [E, F, D]");
  const Shapes s{xd[0], id[1], xd[1], gd[0], gd[2]};
  if (id[0] != s.n || gd[1] != s.d || dd[0] != s.e || dd[1] != s.f ||
      dd[2] != s.d || gate_w.dimensions()[0] != s.n ||
      gate_w.dimensions()[1] != s.k || w_up.dimensions().size() != 3 ||
      !std::equal(gd.begin(), gd.end(), w_up.dimensions().begin()) ||
      (act != kSwiglu && act != kRelu2))
    return ffi::Error::InvalidArgument("moe_ffn: inconsistent shapes or act");

  // Counting sort of the (token, choice) pairs by expert; ids outside
  // [0, E) (none from the router) are skipped.
  const int32_t* ids = idx.typed_data();
  const int64_t pairs = s.n * s.k;
  auto valid = [&](int64_t p) { return ids[p] >= 0 && ids[p] < s.e; };
  std::vector<int64_t> start(s.e + 1, 0);  // first sorted row of expert e
  for (int64_t p = 0; p < pairs; ++p)
    if (valid(p)) ++start[ids[p] + 1];
  for (int64_t e = 0; e < s.e; ++e) start[e + 1] += start[e];
  std::vector<int64_t> row_of_pair(pairs, -1);
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  // Kept between calls: a prefill's rows are megabytes, and fresh memory
  // from the OS costs a page fault per 4 KiB (~1/3 of the kernel's time).
  thread_local std::vector<float> xs, ys;
  xs.resize(start[s.e] * s.d);
  ys.resize(start[s.e] * s.d);
  const float* xp = x.typed_data();
  for (int64_t p = 0; p < pairs; ++p) {
    if (!valid(p)) continue;
    row_of_pair[p] = fill[ids[p]]++;
    std::memcpy(xs.data() + row_of_pair[p] * s.d, xp + (p / s.k) * s.d,
                s.d * sizeof(float));
  }
  // Units of (expert, 64 rows): each unit runs the whole FFN on its rows,
  // so every pair is computed by one unit, in an order that does not depend
  // on which thread runs it or on the other rows (results are deterministic
  // and batch-invariant). (Splitting units further by output columns, in
  // two phases, balanced the threads better but was slower: each phase
  // wakes the pool again.)
  std::vector<std::pair<int64_t, int64_t>> units;  // (expert, first row)
  for (int64_t e = 0; e < s.e; ++e)
    for (int64_t r = start[e]; r < start[e + 1]; r += kUnitRows)
      units.emplace_back(e, r);
  const float *wg = w_gate.typed_data(), *wu = w_up.typed_data(),
              *wd = w_down.typed_data();
  // Not xs / ys inside the lambda: other threads would see their own.
  const float* xs_p = xs.data();
  float* ys_p = ys.data();
  ParallelFor(pool, units.size(), units.size(), [&](int64_t i) {
    const auto [e, first] = units[i];
    RunUnit(s, act, wg, wu, wd, e, first,
            std::min(kUnitRows, start[e + 1] - first), xs_p, ys_p);
  });

  // y[n] = sum_j w[n, j] * ys[row of (n, j)], j in order.
  const float* wp = gate_w.typed_data();
  float* yo = y->typed_data();
  std::fill(yo, yo + s.n * s.d, 0.f);
  for (int64_t p = 0; p < pairs; ++p) {
    if (row_of_pair[p] < 0) continue;
    float* o = yo + (p / s.k) * s.d;
    const float* r = ys.data() + row_of_pair[p] * s.d;
    for (int64_t c = 0; c < s.d; ++c) o[c] += wp[p] * r[c];
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace cascade_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(CascadeJaxMoeFfn, cascade_jax::MoeFfn,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("act"));
