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

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kV = 16;                // floats per vector
constexpr int kNB = 4;                // vectors per column block
constexpr int64_t kCols = kV * kNB;   // 64 columns per block and per unit
constexpr int kRows = 6;              // rows per register block
#ifndef KPF
#define KPF 16
#endif
constexpr int kPrefetch = KPF;

typedef float vf __attribute__((vector_size(kV * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(kV * sizeof(int32_t))));

inline vf Load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
inline vf Splat(float a) { return vf{} + a; }

// c[R, 64] = x[R, K] @ w[K, 64] (row strides ldx, ldw, ldc).
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

// The same for a column tail narrower than 64 (small models).
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

// exp(x) to ~1 ulp on [-87, 88] (Cody-Waite reduction, degree-6 polynomial).
inline vf Exp(vf x) {
  x = x < Splat(-87.3f) ? Splat(-87.3f) : x;
  x = x > Splat(88.3f) ? Splat(88.3f) : x;
  const vf magic = Splat(12582912.f);  // 1.5 * 2^23: round to nearest
  const vf n = (x * Splat(1.44269504088896341f) + magic) - magic;
  const vf r = x - n * Splat(0.693359375f) - n * Splat(-2.12194440e-4f);
  vf p = Splat(1.9875691500e-4f);
  p = p * r + Splat(1.3981999507e-3f);
  p = p * r + Splat(8.3334519073e-3f);
  p = p * r + Splat(4.1665795894e-2f);
  p = p * r + Splat(1.6666665459e-1f);
  p = p * r + Splat(5.0000001201e-1f);
  p = p * r * r + r + Splat(1.f);
  const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
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

// Rows of one expert per unit of work: each unit runs the whole FFN on its
// rows, so every (token, choice) pair is computed by one unit, in an order
// that does not depend on which thread runs it (results are deterministic).
constexpr int64_t kUnitRows = 64;

// Everything the workers share; owned by shared_ptr so that a pool task that
// starts after the call returned (and finds no work) touches live memory.
struct State {
  Shapes s;
  int64_t act;
  const float *wg, *wu, *wd;
  std::vector<int64_t> start;          // [E + 1]: first sorted row of expert
  std::vector<float> xs, ys;           // [P, D]: pairs' rows sorted by expert
  std::vector<int64_t> units;          // expert * P + first row in expert
  std::atomic<int64_t> next_unit{0}, units_done{0};
};

void RunUnits(State& st) {
  const Shapes& s = st.s;
  const int64_t pairs = s.n * s.k;
  std::vector<float> g, u;
  for (;;) {
    const int64_t i = st.next_unit.fetch_add(1);
    if (i >= static_cast<int64_t>(st.units.size())) break;
    const int64_t e = st.units[i] / pairs;
    const int64_t first = st.start[e] + st.units[i] % pairs;
    const int64_t rows = std::min(kUnitRows, st.start[e + 1] - first);
    g.resize(rows * s.f);
    if (st.act == kSwiglu) u.resize(rows * s.f);
    const float* x = st.xs.data() + first * s.d;
    Gemm(rows, s.f, s.d, x, s.d, st.wg + e * s.d * s.f, s.f, g.data(), s.f);
    if (st.act == kSwiglu)
      Gemm(rows, s.f, s.d, x, s.d, st.wu + e * s.d * s.f, s.f, u.data(), s.f);
    Activate(st.act, g.data(), u.data(), rows * s.f);
    Gemm(rows, s.d, s.f, g.data(), s.f, st.wd + e * s.f * s.d, s.d,
         st.ys.data() + first * s.d, s.d);
    st.units_done.fetch_add(1, std::memory_order_release);
  }
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
  auto st = std::make_shared<State>();
  Shapes& s = st->s;
  s = {xd[0], id[1], xd[1], gd[0], gd[2]};
  if (id[0] != s.n || gd[1] != s.d || dd[0] != s.e || dd[1] != s.f ||
      dd[2] != s.d || gate_w.dimensions()[0] != s.n ||
      gate_w.dimensions()[1] != s.k || w_up.dimensions().size() != 3 ||
      !std::equal(gd.begin(), gd.end(), w_up.dimensions().begin()) ||
      (act != kSwiglu && act != kRelu2))
    return ffi::Error::InvalidArgument("moe_ffn: inconsistent shapes or act");
  st->act = act;
  st->wg = w_gate.typed_data();
  st->wu = w_up.typed_data();
  st->wd = w_down.typed_data();

  // Counting sort of the (token, choice) pairs by expert; ids outside
  // [0, E) (none from the router) are skipped.
  const int32_t* ids = idx.typed_data();
  const int64_t pairs = s.n * s.k;
  auto valid = [&](int64_t p) { return ids[p] >= 0 && ids[p] < s.e; };
  st->start.assign(s.e + 1, 0);
  for (int64_t p = 0; p < pairs; ++p)
    if (valid(p)) ++st->start[ids[p] + 1];
  for (int64_t e = 0; e < s.e; ++e) st->start[e + 1] += st->start[e];
  std::vector<int64_t> row_of_pair(pairs, -1);
  std::vector<int64_t> fill(st->start.begin(), st->start.end() - 1);
  st->xs.resize(st->start[s.e] * s.d);
  st->ys.resize(st->start[s.e] * s.d);
  const float* xp = x.typed_data();
  for (int64_t p = 0; p < pairs; ++p) {
    if (!valid(p)) continue;
    row_of_pair[p] = fill[ids[p]]++;
    std::memcpy(st->xs.data() + row_of_pair[p] * s.d, xp + (p / s.k) * s.d,
                s.d * sizeof(float));
  }
  for (int64_t e = 0; e < s.e; ++e)
    for (int64_t r = 0; r < st->start[e + 1] - st->start[e]; r += kUnitRows)
      st->units.push_back(e * pairs + r);

  const int64_t num_units = st->units.size();
  const int64_t helpers =
      std::min<int64_t>(pool.num_threads(), num_units) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([st] { RunUnits(*st); });
  RunUnits(*st);
  // Units other threads claimed may still be running; wait for them.
  while (st->units_done.load(std::memory_order_acquire) < num_units)
    std::this_thread::yield();

  // y[n] = sum_j w[n, j] * ys[row of (n, j)], j in order.
  const float* wp = gate_w.typed_data();
  float* yo = y->typed_data();
  std::fill(yo, yo + s.n * s.d, 0.f);
  for (int64_t p = 0; p < pairs; ++p) {
    if (row_of_pair[p] < 0) continue;
    float* o = yo + (p / s.k) * s.d;
    const float* r = st->ys.data() + row_of_pair[p] * s.d;
    for (int64_t c = 0; c < s.d; ++c) o[c] += wp[p] * r[c];
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CascadeJaxMoeFfn, MoeFfn,
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
