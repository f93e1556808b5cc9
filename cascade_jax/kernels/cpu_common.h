// Shared by the CPU kernels: vectors of kV floats (GCC/Clang vector
// extensions, no intrinsics: -march=native picks the instructions), a
// vectorised exp and a parallel loop over XLA's intra-op thread pool.
//
// kV is the machine's own vector: 16 floats with AVX-512 (32 registers of
// 16), 8 elsewhere (AVX2: 16 registers of 8; NEON: two of its 4-float
// registers a vector). The kernels' register blocks are sized in kV
// vectors for each (kRegisterVectors): 16-float vectors on AVX2 were two
// registers each, and the blocks spilled (the kernels ran 2-5 x slower than
// XLA there, docs/results/archive/cpu_kernels_2026-12-03).

#ifndef CASCADE_JAX_KERNELS_CPU_COMMON_H_
#define CASCADE_JAX_KERNELS_CPU_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace cascade_jax {

#if defined(__AVX512F__)
constexpr int kV = 16;                // floats per vector
constexpr int kRegisterVectors = 32;  // vector registers
#else
constexpr int kV = 8;
constexpr int kRegisterVectors = 16;
#endif

typedef float vf __attribute__((vector_size(kV * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(kV * sizeof(int32_t))));

inline vf Load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
inline vf Splat(float a) { return vf{} + a; }

// exp(x) to ~1 ulp on [-87, 88] (Cody-Waite reduction, degree-6 polynomial);
// below -87.3 it returns exp(-87.3) ~ 1e-38, i.e. 0 beside any normal term.
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

// What the workers of one ParallelFor share; owned by shared_ptr so that a
// pool task that starts after the call returned (and finds no work) touches
// live memory. `fn` is never called once every index is claimed.
struct ParallelWork {
  std::function<void(int64_t)> fn;
  int64_t n = 0;
  std::atomic<int64_t> next{0}, done{0};

  void Drain() {
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) break;
      fn(i);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// fn(i) for every i in [0, n): the calling thread and up to
// min(pool threads, n, max_threads) - 1 pool tasks claim indices one at a
// time. Each index runs exactly once, so work whose outputs depend only on
// its index is deterministic. The caller also works, and waits (yielding)
// only for indices other threads claimed and are running, so a busy pool
// cannot deadlock it.
inline void ParallelFor(xla::ffi::ThreadPool& pool, int64_t n,
                        int64_t max_threads,
                        std::function<void(int64_t)> fn) {
  const int64_t helpers =
      std::min<int64_t>({pool.num_threads(), n, max_threads}) - 1;
  if (helpers <= 0) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto work = std::make_shared<ParallelWork>();
  work->fn = std::move(fn);
  work->n = n;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([work] { work->Drain(); });
  work->Drain();
  while (work->done.load(std::memory_order_acquire) < n)
    std::this_thread::yield();
}

}  // namespace cascade_jax

#endif  // CASCADE_JAX_KERNELS_CPU_COMMON_H_
