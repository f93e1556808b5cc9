// Row-wise argmax for XLA:CPU (the sampler's token choice), as an XLA FFI
// custom call.
//
// Why: XLA:CPU ran jnp.argmax's (value, index) reduction as scalar code, and
// the sampler's replacement (a max, then the least index equal to it) as
// three passes over the logits: ~0.13 ms of a batch-64 decode step over
// 1024 logits. Here: one vectorised pass for each row's maximum, one scan
// for its first position.

#include <cmath>

#include "cpu_common.h"

namespace ffi = xla::ffi;

namespace cascade_jax {
namespace {

// The first index of the maximum of x[0, n); a NaN counts as the maximum
// (as jnp.argmax).
int32_t RowArgmax(const float* x, int64_t n) {
  vf top = Splat(-INFINITY);
  vi nans{};
  int64_t i = 0;
  for (; i + kV <= n; i += kV) {
    const vf v = Load(x + i);
    nans |= v != v;
    top = v > top ? v : top;
  }
  float m = -INFINITY;
  bool nan = false;
  for (int j = 0; j < kV; ++j) {
    m = std::max(m, top[j]);
    nan |= nans[j] != 0;
  }
  for (; i < n; ++i) {
    nan |= std::isnan(x[i]);
    m = std::max(m, x[i]);
  }
  for (int64_t j = 0; j < n; ++j)
    if (nan ? std::isnan(x[j]) : x[j] == m) return static_cast<int32_t>(j);
  return 0;  // n == 0
}

ffi::Error Argmax(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::S32> out) {
  auto xd = x.dimensions();
  if (xd.size() < 1)
    return ffi::Error::InvalidArgument("argmax: expects x [..., N]");
  const int64_t n = xd.back();
  const int64_t rows = n == 0 ? 0 : x.element_count() / n;
  const float* xp = x.typed_data();
  int32_t* o = out->typed_data();
  for (int64_t r = 0; r < rows; ++r) o[r] = RowArgmax(xp + r * n, n);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace cascade_jax

XLA_FFI_DEFINE_HANDLER_SYMBOL(CascadeJaxArgmax, cascade_jax::Argmax,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
