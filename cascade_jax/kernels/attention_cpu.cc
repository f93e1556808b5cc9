// Attention over the KV cache for XLA:CPU (the sampler's prefill and decode
// steps), as an XLA FFI custom call: QK-norm and RoPE of the new queries and
// keys, the new keys and values written into the cache in place, and the
// masked softmax attention.
//
// Why: XLA:CPU ran a decode step's two attention dots over every cache slot
// as many tiny batched matmuls (~0.4 ms a layer at batch 64 over 96 slots),
// its cache updates copied the whole cache, and its RoPE (a concatenate)
// cost as much as a projection. Here each (batch row, kv head) is one unit
// of work: its new keys / values, then for each of its queries the softmax
// over the slots up to the last one any of its queries may see (the empty
// slots past it are not read at all). Units are independent, so results
// are deterministic and batch-invariant.

#include <cmath>
#include <vector>

#include "cpu_common.h"

namespace ffi = xla::ffi;

namespace cascade_jax {
namespace {

struct Shapes {
  int64_t b, k, q, h, t, s;  // batch, kv heads, queries per kv head (T*G),
                             // head dim, new tokens, cache slots
};

// c[R, kV NB] = a[R, n] @ b[n, kV NB] (row strides lda, ldb, ldc): each
// vector of b is loaded once for the R rows. Both halves of attention:
// logits (a = queries, b = keys [H, S]) and value sums (a = probabilities,
// b = values [S, H]).
template <int R, int NB>
void MicroGemm(const float* a, int64_t lda, const float* b, int64_t ldb,
               int64_t n, float* c, int64_t ldc) {
  vf acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NB; ++j) acc[r][j] = vf{};
  for (int64_t i = 0; i < n; ++i) {
    vf bv[NB];
    for (int j = 0; j < NB; ++j) bv[j] = Load(b + i * ldb + j * kV);
    for (int r = 0; r < R; ++r) {
      const vf x = Splat(a[r * lda + i]);
      for (int j = 0; j < NB; ++j) acc[r][j] += x * bv[j];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NB; ++j) Store(c + r * ldc + j * kV, acc[r][j]);
}

// Vectors of b a register block takes for R rows: R x NB accumulators, NB
// vectors of b and one of a within the machine's registers (AVX-512: 4
// for up to 4 rows; AVX2: 4 for up to 2 rows, 2 for 3 or 4).
template <int R>
constexpr int BlockVectors() {
  return (R + 1) * 4 + 1 <= kRegisterVectors ? 4 : 2;
}

// l[r, kV j : kV (j + 1)] = q[r] . k[:, kV j : kV (j + 1)] for R rows.
template <int R, int NB>
void LogitsBlock(const float* q, int64_t h_dim, const float* k, int64_t ldk,
                 float* l, int64_t ldl) {
  MicroGemm<R, NB>(q, h_dim, k, ldk, h_dim, l, ldl);
}

template <int R>
void LogitsRows(const float* q, int64_t h_dim, const float* k, int64_t ldk,
                int64_t vectors, float* l, int64_t ldl) {
  constexpr int kNB = BlockVectors<R>();
  int64_t j = 0;
  for (; j + kNB <= vectors; j += kNB)
    LogitsBlock<R, kNB>(q, h_dim, k + j * kV, ldk, l + j * kV, ldl);
  switch (vectors - j) {
    case 3: LogitsBlock<R, 3>(q, h_dim, k + j * kV, ldk, l + j * kV, ldl); break;
    case 2: LogitsBlock<R, 2>(q, h_dim, k + j * kV, ldk, l + j * kV, ldl); break;
    case 1: LogitsBlock<R, 1>(q, h_dim, k + j * kV, ldk, l + j * kV, ldl); break;
    default: break;
  }
}

// l[r, s] = q[r] . k[:, s] for `rows` rows and s in [0, limit); k is
// [H, S] (row stride S). Whole vectors while they lie inside the row (the
// last row's would run past the buffer), the rest one slot at a time.
void Logits(const float* q, int64_t rows, int64_t h_dim, const float* k,
            int64_t s_dim, int64_t limit, float* l, int64_t ldl) {
  const int64_t vectors = std::min((limit + kV - 1) / kV, s_dim / kV);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    LogitsRows<4>(q + r * h_dim, h_dim, k, s_dim, vectors, l + r * ldl, ldl);
  switch (rows - r) {  // a decode step's G = 2 query heads: one pass
    case 3: LogitsRows<3>(q + r * h_dim, h_dim, k, s_dim, vectors, l + r * ldl, ldl); break;
    case 2: LogitsRows<2>(q + r * h_dim, h_dim, k, s_dim, vectors, l + r * ldl, ldl); break;
    case 1: LogitsRows<1>(q + r * h_dim, h_dim, k, s_dim, vectors, l + r * ldl, ldl); break;
    default: break;
  }
  for (int64_t s = vectors * kV; s < limit; ++s)
    for (int64_t i = 0; i < rows; ++i) {
      float acc = 0.f;
      for (int64_t h = 0; h < h_dim; ++h) acc += q[i * h_dim + h] * k[h * s_dim + s];
      l[i * ldl + s] = acc;
    }
}

// o[r, :kV NH] = sum_{s < limit} p[r, s] v[s, :kV NH] for 2 rows at a time
// (the rows of v and o are H floats apart).
template <int NH>
void WeightedSumRows(const float* p, int64_t ldp, int64_t rows,
                     const float* v, int64_t h_dim, int64_t limit, float* o) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2)
    MicroGemm<2, NH>(p + r * ldp, ldp, v, h_dim, limit, o + r * h_dim, h_dim);
  if (r < rows)
    MicroGemm<1, NH>(p + r * ldp, ldp, v, h_dim, limit, o + r * h_dim, h_dim);
}

// o[r] = sum_{s < limit} p[r, s] v[s]; v is [S, H]: the H columns in blocks
// of up to BlockVectors<2>() vectors (each block reads p again, from cache).
void Values(const float* p, int64_t ldp, int64_t rows, const float* v,
            int64_t h_dim, int64_t limit, float* o) {
  if (h_dim % kV == 0) {
    constexpr int kNB = BlockVectors<2>();
    const int64_t vectors = h_dim / kV;
    for (int64_t c = 0; c < vectors; c += kNB) {
      const float* vc = v + c * kV;
      float* oc = o + c * kV;
      switch (std::min<int64_t>(kNB, vectors - c)) {
        case 4: WeightedSumRows<4>(p, ldp, rows, vc, h_dim, limit, oc); break;
        case 3: WeightedSumRows<3>(p, ldp, rows, vc, h_dim, limit, oc); break;
        case 2: WeightedSumRows<2>(p, ldp, rows, vc, h_dim, limit, oc); break;
        default: WeightedSumRows<1>(p, ldp, rows, vc, h_dim, limit, oc); break;
      }
    }
    return;
  }
  std::memset(o, 0, rows * h_dim * sizeof(float));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = 0; s < limit; ++s) {
      const float a = p[r * ldp + s];
      for (int64_t h = 0; h < h_dim; ++h) o[r * h_dim + h] += a * v[s * h_dim + h];
    }
}

// The call's operands; q_norm / k_norm / cos / sin are null when absent.
struct Inputs {
  const float *q, *k_new, *v_new;
  const bool* mask;
  const float *q_norm, *k_norm;  // [H] RMSNorm scales
  const float *cos, *sin;        // [B, T, H/2] RoPE tables
  float scale, eps;
  int64_t start;                 // the first slot written
};

// y = rope(norm(x)) for one head's H floats, as the model's XLA path: the
// QK-norm x / sqrt(mean(x^2) + eps) * w when w is given, then the
// rotate-half RoPE with this token's cos / sin when c is.
void Prepare(const float* x, int64_t h_dim, const float* w, float eps,
             const float* c, const float* sn, float* y) {
  if (w != nullptr) {
    // sum(x^2) in kV lanes, then across them (a scalar sum is a chain of
    // dependent adds: the prefill's norms cost as much as its logits).
    vf acc{};
    int64_t h = 0;
    for (; h + kV <= h_dim; h += kV) {
      const vf v = Load(x + h);
      acc += v * v;
    }
    float sum = 0.f;
    for (int i = 0; i < kV; ++i) sum += acc[i];
    for (; h < h_dim; ++h) sum += x[h] * x[h];
    const float r = 1.f / std::sqrt(sum / h_dim + eps);
    for (int64_t h = 0; h < h_dim; ++h) y[h] = x[h] * r * w[h];
  } else {
    std::memcpy(y, x, h_dim * sizeof(float));
  }
  if (c != nullptr) {
    const int64_t half = h_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
      const float a = y[i], b = y[i + half];
      y[i] = a * c[i] - b * sn[i];
      y[i + half] = b * c[i] + a * sn[i];
    }
  }
}

// One unit: batch row `bi`, kv head `ki`.
void AttendUnit(const Shapes& d, const Inputs& in, int64_t bi, int64_t ki,
                float* ck, float* cv, float* out) {
  const int64_t g = d.q / d.t, n = d.k * g, half = d.h / 2;
  const int64_t start = in.start;
  const float scale = in.scale;
  auto rope = [&](const float* table, int64_t t) {
    return table == nullptr ? nullptr : table + (bi * d.t + t) * half;
  };
  ck += (bi * d.k + ki) * d.h * d.s;  // [H, S]
  cv += (bi * d.k + ki) * d.s * d.h;  // [S, H]
  thread_local std::vector<float> qs, os, logits, kt;
  kt.resize(d.h);
  for (int64_t t = 0; t < d.t; ++t) {
    const float* kn = in.k_new + ((bi * d.t + t) * d.k + ki) * d.h;
    const float* vn = in.v_new + ((bi * d.t + t) * d.k + ki) * d.h;
    Prepare(kn, d.h, in.k_norm, in.eps, rope(in.cos, t), rope(in.sin, t),
            kt.data());
    for (int64_t h = 0; h < d.h; ++h) ck[h * d.s + start + t] = kt[h];
    std::memcpy(cv + (start + t) * d.h, vn, d.h * sizeof(float));
  }
  const bool* m = in.mask + bi * d.t * d.s;  // [T, S]
  int64_t limit = 0;  // one past the last slot any query of this row sees
  for (int64_t t = 0; t < d.t; ++t)
    for (int64_t s = d.s - 1; s >= limit; --s)
      if (m[t * d.s + s]) {
        limit = s + 1;
        break;
      }
  // This kv head's queries as rows r = t * G + j of qs [Q, H]; q and out
  // are [B, T, N, H] with query head ki * G + j.
  qs.resize(d.q * d.h);
  os.resize(d.q * d.h);
  for (int64_t t = 0; t < d.t; ++t)
    for (int64_t j = 0; j < g; ++j)
      Prepare(in.q + ((bi * d.t + t) * n + ki * g + j) * d.h, d.h, in.q_norm,
              in.eps, rope(in.cos, t), rope(in.sin, t),
              qs.data() + (t * g + j) * d.h);
  float* o = os.data();
  // Logits of every query row, then each row's masked softmax in place.
  const int64_t ldl = std::max<int64_t>((limit + kV - 1) / kV * kV, kV);
  logits.resize(d.q * ldl);
  float* l = logits.data();
  Logits(qs.data(), d.q, d.h, ck, d.s, limit, l, ldl);
  const vf scale_v = Splat(scale);
  bool any_blind = false;
  for (int64_t r = 0; r < d.q; ++r) {
    const bool* mr = m + (r / g) * d.s;
    float* lr = l + r * ldl;
    float top = -INFINITY;
    for (int64_t s = 0; s < limit; ++s)
      if (mr[s]) top = std::max(top, lr[s] * scale);
    if (top == -INFINITY) {  // sees no slot: handled below
      std::fill(lr, lr + ldl, 0.f);
      any_blind = true;
      continue;
    }
    const vf top_v = Splat(top);
    for (int64_t s = 0; s < ldl; s += kV)
      Store(lr + s, Exp(Load(lr + s) * scale_v - top_v));
    float sum = 0.f;
    for (int64_t s = 0; s < limit; ++s) {
      if (!mr[s]) lr[s] = 0.f;
      sum += lr[s];
    }
    const vf sum_v = Splat(sum);
    for (int64_t s = 0; s < ldl; s += kV) Store(lr + s, Load(lr + s) / sum_v);
  }
  Values(l, ldl, d.q, cv, d.h, limit, o);
  // A query that sees no slot (padding) gets what XLA's softmax over all
  // -1e30 logits gives: the mean of every slot's value.
  for (int64_t r = 0; any_blind && r < d.q; ++r) {
    const bool* mr = m + (r / g) * d.s;
    if (std::any_of(mr, mr + limit, [](bool x) { return x; })) continue;
    float* orow = o + r * d.h;
    std::fill(orow, orow + d.h, 0.f);
    const float w = 1.f / d.s;
    for (int64_t s = 0; s < d.s; ++s)
      for (int64_t h = 0; h < d.h; ++h) orow[h] += w * cv[s * d.h + h];
  }
  for (int64_t t = 0; t < d.t; ++t)
    std::memcpy(out + ((bi * d.t + t) * n + ki * g) * d.h, o + t * g * d.h,
                g * d.h * sizeof(float));
}

ffi::Error CacheAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                          ffi::Buffer<ffi::F32> k_new,
                          ffi::Buffer<ffi::F32> v_new,
                          ffi::Buffer<ffi::F32> cache_k,
                          ffi::Buffer<ffi::F32> cache_v,
                          ffi::Buffer<ffi::PRED> mask,
                          ffi::Buffer<ffi::S32> index,
                          ffi::Buffer<ffi::F32> q_norm,
                          ffi::Buffer<ffi::F32> k_norm,
                          ffi::Buffer<ffi::F32> cos,
                          ffi::Buffer<ffi::F32> sin,
                          ffi::ResultBuffer<ffi::F32> out,
                          ffi::ResultBuffer<ffi::F32> cache_k_out,
                          ffi::ResultBuffer<ffi::F32> cache_v_out,
                          float scale, float eps) {
  auto qd = q.dimensions(), kd = k_new.dimensions(), ckd = cache_k.dimensions(),
       cvd = cache_v.dimensions(), md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || ckd.size() != 4 || cvd.size() != 4 ||
      md.size() != 3 || index.element_count() != 1)
    return ffi::Error::InvalidArgument(
        "cache_attention: expects q [B, T, N, H], k_new / v_new [B, T, K, H], "
        "cache_k [B, K, H, S], cache_v [B, K, S, H], mask [B, T, S], index []");
  // N query heads in groups of G = N / K per kv head: Q = T * G rows each.
  Shapes d{qd[0], kd[2], qd[1] * (qd[2] / std::max<int64_t>(kd[2], 1)), qd[3],
           qd[1], ckd[3]};
  if (kd[0] != d.b || kd[1] != d.t || d.k < 1 || qd[2] % d.k != 0 ||
      kd[3] != d.h || d.t < 1 || d.t > d.s ||
      !std::equal(kd.begin(), kd.end(), v_new.dimensions().begin()) ||
      ckd[0] != d.b || ckd[1] != d.k || ckd[2] != d.h ||
      cvd[0] != d.b || cvd[1] != d.k || cvd[2] != d.s || cvd[3] != d.h ||
      md[0] != d.b || md[1] != d.t || md[2] != d.s)
    return ffi::Error::InvalidArgument("cache_attention: inconsistent shapes");
  // The QK-norm scales ([H] each) and RoPE tables ([B, T, H/2] each) are
  // empty when the model has none.
  const int64_t n_q_norm = q_norm.element_count(),
                n_k_norm = k_norm.element_count(),
                n_cos = cos.element_count(), n_sin = sin.element_count();
  const bool has_norm = n_q_norm > 0, has_rope = n_cos > 0;
  if ((has_norm && (n_q_norm != d.h || n_k_norm != d.h)) ||
      (has_rope && (d.h % 2 != 0 || n_cos != d.b * d.t * d.h / 2 ||
                    n_sin != n_cos)))
    return ffi::Error::InvalidArgument(
        "cache_attention: q_norm / k_norm must be [H], cos / sin [B, T, H/2]");
  float* ck = cache_k_out->typed_data();
  float* cv = cache_v_out->typed_data();
  // The outputs alias the cache inputs (input_output_aliases); copy only if
  // XLA did not honour that.
  if (ck != cache_k.typed_data())
    std::memcpy(ck, cache_k.typed_data(), cache_k.size_bytes());
  if (cv != cache_v.typed_data())
    std::memcpy(cv, cache_v.typed_data(), cache_v.size_bytes());
  // As XLA's dynamic_update_slice: the start is clamped so the T slots fit.
  const int64_t start =
      std::clamp<int64_t>(index.typed_data()[0], 0, d.s - d.t);
  const Inputs in{q.typed_data(),
                  k_new.typed_data(),
                  v_new.typed_data(),
                  mask.typed_data(),
                  has_norm ? q_norm.typed_data() : nullptr,
                  has_norm ? k_norm.typed_data() : nullptr,
                  has_rope ? cos.typed_data() : nullptr,
                  has_rope ? sin.typed_data() : nullptr,
                  scale,
                  eps,
                  start};
  float* op = out->typed_data();
  // A decode step at batch 1 is a few microseconds of work: below ~64k
  // multiply-adds, waking another thread costs more than it saves.
  const int64_t work = d.b * d.k * d.q * d.h * d.s;
  const int64_t units = d.b * d.k;
  ParallelFor(pool, units, work < (1 << 16) ? 1 : units, [&](int64_t u) {
    AttendUnit(d, in, u / d.k, u % d.k, ck, cv, op);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace cascade_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(CascadeJaxCacheAttention,
                              cascade_jax::CacheAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<float>("eps"));
