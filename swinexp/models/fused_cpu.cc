// swinexp's fused CPU kernels (model.kernels=fused_cpu): MindSpore Custom ops of type "aot", compiled by
// swinexp/models/fused_cpu.py on first use. Each kernel is one pass over its tensors where MindSpore's CPU backend
// runs a chain of elementwise kernels (BENCHMARKS.md, "Fused CPU kernels").
//
// The AOT interface (MindSpore's op_custom_aot tutorial): params holds the inputs, then the outputs; ndims/shapes
// their shapes. float32 only: the Python side sends other dtypes to MindSpore's own kernels.
//
// Results do not depend on the number of threads: every output element is computed by the same expression
// whichever thread computes it, and sums over rows (LayerNorm's dgamma, dbeta) add fixed blocks in a fixed order.
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// f(begin, end) over [0, n) in contiguous chunks, one per usable core, each of at least `grain` items (a small
// tensor stays on this thread); chunk starts are multiples of `align` (whole SIMD vectors).
template <typename F>
void parallel_for(int64_t n, int64_t grain, int64_t align, F f) {
  static const int cores = usable_cores();
  int parts = static_cast<int>(std::min<int64_t>(cores, (n + grain - 1) / grain));
  if (parts <= 1) {
    f(0, n);
    return;
  }
  int64_t chunk = ((n + parts - 1) / parts + align - 1) / align * align;
  std::vector<std::thread> workers;
  for (int p = 1; p < parts; ++p) {
    int64_t begin = p * chunk, end = std::min(n, begin + chunk);
    if (begin < end) workers.emplace_back(f, begin, end);
  }
  f(0, std::min(n, chunk));
  for (auto &w : workers) w.join();
}

constexpr int64_t kGrain = 1 << 15;  // elements: below this a thread costs more than it saves

int64_t numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

// sum of term(0) .. term(n - 1) in kLanes interleaved partial sums added in a fixed order: the loop vectorizes (a
// plain float sum may not be reordered, so it would not), and the result depends on n and the values only.
constexpr int kLanes = 16;

template <typename F>
inline float lane_sum(int64_t n, F term) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(j + l);
  for (int l = 0; j + l < n; ++l) acc[l] += term(j + l);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

// max of v[0] .. v[n - 1] (n >= 1) in kLanes interleaved partial maxima, so the loop vectorizes.
inline float lane_max(int64_t n, const float *v) {
  float acc[kLanes];
  for (int l = 0; l < kLanes; ++l) acc[l] = v[0];
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = std::max(acc[l], v[j + l]);
  for (int l = 0; j + l < n; ++l) acc[l] = std::max(acc[l], v[j + l]);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] = std::max(acc[l], acc[l + width]);
  return acc[0];
}

// exp(a) for a <= 0: Cephes' expf (range reduction by ln 2, degree-6 polynomial), branch-free so loops vectorize.
inline float exp_nonpositive(float a) {
  a = std::max(a, -87.0f);
  float n = std::nearbyint(a * 1.44269504088896341f);
  float r = std::fma(n, -0.693359375f, a);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p * r, r, r) + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// The standard normal's cdf Phi(x) and density phi(x). Phi(x) = erfc(-x / sqrt 2) / 2, with erfc(z) = t exp(-z^2)
// h(t), t = 1 / (1 + z / 2) (Numerical Recipes' variable) and h a degree-11 polynomial in u = 2t - 1, fitted near
// minimax to erfcx(z) / t over all z >= 0 (relative error 5e-8 with these float coefficients, ~1.6e-7 evaluated in
// float; tests/test_fused_cpu.py): the small tail keeps its relative precision instead of being 1 + erf(x) rounded
// next to 1, with one exp for both Phi and phi; exp(-x^2 / 2) uses x^2's rounding error too.
inline void normal_cdf_pdf(float x, float &cdf, float &pdf) {
  float z = std::fabs(x) * 0.70710678118654752f;
  float t = 1.0f / std::fma(0.5f, z, 1.0f);
  float u = std::fma(2.0f, t, -1.0f);
  float h = 2.0193438e-06f;
  h = std::fma(h, u, 4.2958512e-05f);
  h = std::fma(h, u, -4.2035677e-05f);
  h = std::fma(h, u, -3.0136443e-04f);
  h = std::fma(h, u, 4.3595565e-04f);
  h = std::fma(h, u, 1.5308781e-03f);
  h = std::fma(h, u, -3.2456811e-03f);
  h = std::fma(h, u, -1.0752235e-02f);
  h = std::fma(h, u, 1.8222047e-02f);
  h = std::fma(h, u, 1.3973580e-01f);
  h = std::fma(h, u, 3.4358031e-01f);
  h = std::fma(h, u, 5.1079136e-01f);
  float xx = x * x;
  float gauss = exp_nonpositive(-0.5f * xx - 0.5f * std::fma(x, x, -xx));  // exp(-x^2 / 2)
  float tail = 0.5f * t * gauss * h;                                         // erfc(|x| / sqrt 2) / 2
  cdf = x < 0.0f ? tail : 1.0f - tail;
  pdf = gauss * 0.3989422804014327f;
}

}  // namespace

// GELU forward: y = x * Phi(x). Inputs x; outputs y.
extern "C" int GeluForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                           void *extra) {
  if (nparam != 2) return 1;
  const float *x = static_cast<const float *>(params[0]);
  float *y = static_cast<float *>(params[1]);
  parallel_for(numel(ndims[0], shapes[0]), kGrain, 16, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float cdf, pdf;
      normal_cdf_pdf(x[i], cdf, pdf);
      y[i] = x[i] * cdf;
    }
  });
  return 0;
}

// GELU backward: dx = dy * (Phi(x) + x * phi(x)), from x alone (nothing of the forward is kept). Inputs x, dy.
extern "C" int GeluBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  if (nparam != 3) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *dy = static_cast<const float *>(params[1]);
  float *dx = static_cast<float *>(params[2]);
  parallel_for(numel(ndims[0], shapes[0]), kGrain, 16, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float cdf, pdf;
      normal_cdf_pdf(x[i], cdf, pdf);
      dx[i] = dy[i] * std::fma(x[i], pdf, cdf);
    }
  });
  return 0;
}

// LayerNorm forward over the last axis of x (R, C). Inputs x, gamma (C), beta (C), epsilon (1); outputs y (R, C),
// mean (R, 1), inv_std (R, 1) = 1 / sqrt(variance + epsilon). The row's sum, rounded, is corrected by the sum of the
// residuals (rows far from zero keep their mean to float precision), and the variance is taken around that mean.
extern "C" int LayerNormForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                void *stream, void *extra) {
  if (nparam != 7 || ndims[0] != 2) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *gamma = static_cast<const float *>(params[1]);
  const float *beta = static_cast<const float *>(params[2]);
  const float epsilon = *static_cast<const float *>(params[3]);
  float *y = static_cast<float *>(params[4]);
  float *mean = static_cast<float *>(params[5]);
  float *inv_std = static_cast<float *>(params[6]);
  const int64_t rows = shapes[0][0], width = shapes[0][1];
  parallel_for(rows, std::max<int64_t>(1, kGrain / width), 1, [=](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float *xr = x + r * width;
      float *yr = y + r * width;
      const float rough = lane_sum(width, [=](int64_t j) { return xr[j]; }) / width;
      const float m = rough + lane_sum(width, [=](int64_t j) { return xr[j] - rough; }) / width;
      const float variance = lane_sum(width, [=](int64_t j) { return (xr[j] - m) * (xr[j] - m); }) / width;
      const float s = 1.0f / std::sqrt(variance + epsilon);
      for (int64_t j = 0; j < width; ++j) yr[j] = std::fma((xr[j] - m) * s, gamma[j], beta[j]);
      mean[r] = m;
      inv_std[r] = s;
    }
  });
  return 0;
}

// LayerNorm backward over the last axis of x (R, C). Inputs x, gamma (C), mean (R, 1), inv_std (R, 1), dy (R, C);
// outputs dx (R, C), dgamma (C), dbeta (C). With x_hat = (x - mean) * inv_std and g = dy * gamma, per row:
// dx = (g - mean(g) - x_hat * mean(g * x_hat)) * inv_std. dgamma = sum over rows of dy * x_hat, dbeta of dy: each
// block of kRowBlock rows sums into its own partial row, and the partials are added in block order (in double), so
// the sums do not depend on which thread took which block.
namespace {
constexpr int64_t kRowBlock = 64;

// One row of LayerNorm's backward: writes dx and adds the row's dgamma and dbeta terms into partial_gamma/_beta.
void layer_norm_backward_row(int64_t width, const float *__restrict x, const float *__restrict gamma, float mean,
                             float inv_std, const float *__restrict dy, float *__restrict dx,
                             float *__restrict partial_gamma, float *__restrict partial_beta) {
  const float mean_g = lane_sum(width, [=](int64_t j) { return dy[j] * gamma[j]; }) / width;
  const float mean_gx =
      lane_sum(width, [=](int64_t j) { return dy[j] * gamma[j] * ((x[j] - mean) * inv_std); }) / width;
  for (int64_t j = 0; j < width; ++j) {
    const float x_hat = (x[j] - mean) * inv_std;
    partial_gamma[j] = std::fma(dy[j], x_hat, partial_gamma[j]);
    partial_beta[j] += dy[j];
    dx[j] = (dy[j] * gamma[j] - mean_g - x_hat * mean_gx) * inv_std;
  }
}
}  // namespace

extern "C" int LayerNormBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  if (nparam != 8 || ndims[0] != 2) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *gamma = static_cast<const float *>(params[1]);
  const float *mean = static_cast<const float *>(params[2]);
  const float *inv_std = static_cast<const float *>(params[3]);
  const float *dy = static_cast<const float *>(params[4]);
  float *dx = static_cast<float *>(params[5]);
  float *dgamma = static_cast<float *>(params[6]);
  float *dbeta = static_cast<float *>(params[7]);
  const int64_t rows = shapes[0][0], width = shapes[0][1];
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> partial_gamma(blocks * width, 0.0f), partial_beta(blocks * width, 0.0f);
  parallel_for(blocks, std::max<int64_t>(1, kGrain / (kRowBlock * width)), 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      for (int64_t r = b * kRowBlock; r < std::min(rows, (b + 1) * kRowBlock); ++r)
        layer_norm_backward_row(width, x + r * width, gamma, mean[r], inv_std[r], dy + r * width, dx + r * width,
                                partial_gamma.data() + b * width, partial_beta.data() + b * width);
    }
  });
  for (int64_t j = 0; j < width; ++j) {
    double sg = 0.0, sb = 0.0;
    for (int64_t b = 0; b < blocks; ++b) {
      sg += partial_gamma[b * width + j];
      sb += partial_beta[b * width + j];
    }
    dgamma[j] = static_cast<float>(sg);
    dbeta[j] = static_cast<float>(sb);
  }
  return 0;
}

// Softmax backward over the last axis. Inputs y (the softmax's output), dy; output dx = y * (dy - sum(y * dy)) per
// row of the last axis.
extern "C" int SoftmaxBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  if (nparam != 3 || ndims[0] < 1) return 1;
  const float *y = static_cast<const float *>(params[0]);
  const float *dy = static_cast<const float *>(params[1]);
  float *dx = static_cast<float *>(params[2]);
  const int64_t width = shapes[0][ndims[0] - 1];
  const int64_t rows = numel(ndims[0], shapes[0]) / std::max<int64_t>(width, 1);
  parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(width, 1)), 1, [=](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float *yr = y + r * width, *dyr = dy + r * width;
      float *dxr = dx + r * width;
      const float dot = lane_sum(width, [=](int64_t j) { return yr[j] * dyr[j]; });
      for (int64_t j = 0; j < width; ++j) dxr[j] = yr[j] * (dyr[j] - dot);
    }
  });
  return 0;
}

// AdamW's update of one parameter, in place: MindSpore's AdamWeightDecay, the same inputs in the same order (var, m,
// v written; lr, beta1, beta2, epsilon, decay one element each; gradient) and nnacl's AdamWeightDecayFp32 expression
// in float, vectorized (MindSpore's CPU build runs it scalar, in double). Output: a (1,) placeholder.
extern "C" int AdamWUpdate(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                           void *stream, void *extra) {
  if (nparam != 10) return 1;
  float *var = static_cast<float *>(params[0]);
  float *m = static_cast<float *>(params[1]);
  float *v = static_cast<float *>(params[2]);
  const float lr = *static_cast<const float *>(params[3]);
  const float beta1_minus = 1.0f - *static_cast<const float *>(params[4]);
  const float beta2_minus = 1.0f - *static_cast<const float *>(params[5]);
  const float epsilon = *static_cast<const float *>(params[6]);
  const float decay = *static_cast<const float *>(params[7]);
  const float *gradient = static_cast<const float *>(params[8]);
  *static_cast<float *>(params[9]) = 0.0f;
  parallel_for(numel(ndims[0], shapes[0]), kGrain, 16, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float m_new = m[i] + (gradient[i] - m[i]) * beta1_minus;
      const float v_new = v[i] + (gradient[i] * gradient[i] - v[i]) * beta2_minus;
      m[i] = m_new;
      v[i] = v_new;
      var[i] -= lr * (m_new / (std::sqrt(v_new) + epsilon) + decay * var[i]);
    }
  });
  return 0;
}

// Softmax over the last axis of x + bias, the bias repeating every `period` rows: x (rows, width) as (blocks, period,
// width), bias (period, width); y = softmax(x + bias) per row. The attention's position bias (and shifted windows'
// mask) added and normalized in one pass, where MindSpore broadcasts the bias, adds, then runs its Softmax.
extern "C" int BiasSoftmaxForward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                  void *stream, void *extra) {
  if (nparam != 3 || ndims[0] < 1) return 1;
  const float *x = static_cast<const float *>(params[0]);
  const float *bias = static_cast<const float *>(params[1]);
  float *y = static_cast<float *>(params[2]);
  const int64_t width = shapes[0][ndims[0] - 1];
  if (width < 1 || shapes[1][ndims[1] - 1] != width) return 1;
  const int64_t rows = numel(ndims[0], shapes[0]) / width, period = numel(ndims[1], shapes[1]) / width;
  if (period < 1 || rows % period != 0) return 1;
  parallel_for(rows, std::max<int64_t>(1, kGrain / width), 1, [=](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float *xr = x + r * width, *br = bias + (r % period) * width;
      float *yr = y + r * width;
      for (int64_t j = 0; j < width; ++j) yr[j] = xr[j] + br[j];
      const float top = lane_max(width, yr);
      for (int64_t j = 0; j < width; ++j) yr[j] = exp_nonpositive(yr[j] - top);
      const float scale = 1.0f / lane_sum(width, [=](int64_t j) { return yr[j]; });
      for (int64_t j = 0; j < width; ++j) yr[j] *= scale;
    }
  });
  return 0;
}

// Backward of BiasSoftmaxForward. Inputs y, dy (rows, width), bias (period, width; only its shape is read); outputs
// dx = y * (dy - sum(y * dy)) per row, and dbias = the sum of dx over the blocks, added in block order per bias row
// (the same bits on one core or all).
extern "C" int BiasSoftmaxBackward(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                   void *stream, void *extra) {
  if (nparam != 5 || ndims[0] < 1) return 1;
  const float *y = static_cast<const float *>(params[0]);
  const float *dy = static_cast<const float *>(params[1]);
  float *dx = static_cast<float *>(params[3]);
  float *dbias = static_cast<float *>(params[4]);
  const int64_t width = shapes[0][ndims[0] - 1];
  if (width < 1 || shapes[2][ndims[2] - 1] != width) return 1;
  const int64_t rows = numel(ndims[0], shapes[0]) / width, period = numel(ndims[2], shapes[2]) / width;
  if (period < 1 || rows % period != 0) return 1;
  const int64_t blocks = rows / period;
  parallel_for(period, std::max<int64_t>(1, kGrain / (width * blocks)), 1, [=](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      float *db = dbias + p * width;
      std::fill(db, db + width, 0.0f);
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t offset = (b * period + p) * width;
        const float *yr = y + offset, *dyr = dy + offset;
        float *dxr = dx + offset;
        const float dot = lane_sum(width, [=](int64_t j) { return yr[j] * dyr[j]; });
        for (int64_t j = 0; j < width; ++j) {
          dxr[j] = yr[j] * (dyr[j] - dot);
          db[j] += dxr[j];
        }
      }
    }
  });
  return 0;
}

// The global L2 norm of many tensors scaled by one factor, sqrt(sum((factor * g)^2)), for the update's clip and
// overflow check: inputs factor (one element), then the tensors; output (1,). The sum is taken over fixed blocks
// of every tensor (lane sums, float), the blocks' partials added in double in their order: the result depends on
// the values only, not on the number of threads.
extern "C" int GlobalNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                          void *extra) {
  if (nparam < 3) return 1;
  const float factor = *static_cast<const float *>(params[0]);
  const int tensors = nparam - 2;
  constexpr int64_t kBlock = 1 << 13;
  std::vector<std::pair<const float *, int64_t>> blocks;  // (start, length)
  for (int t = 0; t < tensors; ++t) {
    const float *g = static_cast<const float *>(params[1 + t]);
    const int64_t n = numel(ndims[1 + t], shapes[1 + t]);
    for (int64_t b = 0; b < n; b += kBlock) blocks.emplace_back(g + b, std::min(kBlock, n - b));
  }
  std::vector<double> partial(blocks.size());
  parallel_for(static_cast<int64_t>(blocks.size()), kGrain / kBlock, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const float *g = blocks[b].first;
      partial[b] = lane_sum(blocks[b].second, [=](int64_t i) {
        const float x = factor * g[i];
        return x * x;
      });
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  *static_cast<float *>(params[nparam - 1]) = static_cast<float>(std::sqrt(total));
  return 0;
}

// AdamW over all parameters in one call: AdamWUpdate's expression per element, every parameter's gradient first
// multiplied by two factors in turn (the unscale 1 / (loss scale * micro-batches), then the clip coefficient: what
// the train step's two passes over the gradients computed). Inputs: lr, beta1, beta2, epsilon, decay_factor,
// unscale, clip, apply (one element each; apply 0 leaves everything as it is: the train step's overflow skip, with
// no branch in its graph), decays (N,) (each parameter's weight decay, times decay_factor here), then var x N,
// m x N, v x N (written in place) and gradient x N; output: a (1,) placeholder. The parameters are one index space
// cut into per-core chunks, so small parameters share a thread and large ones are split.
extern "C" int AdamWUpdateAll(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  constexpr int kScalars = 9;  // lr .. apply, and decays
  if (nparam < kScalars + 5 || (nparam - kScalars - 1) % 4 != 0) return 1;
  const int count = (nparam - kScalars - 1) / 4;
  auto scalar = [&](int i) { return *static_cast<const float *>(params[i]); };
  const float lr = scalar(0), beta1_minus = 1.0f - scalar(1), beta2_minus = 1.0f - scalar(2);
  const float epsilon = scalar(3), decay_factor = scalar(4), unscale = scalar(5), clip = scalar(6);
  const float *decays = static_cast<const float *>(params[8]);
  if (numel(ndims[8], shapes[8]) != count) return 1;
  *static_cast<float *>(params[nparam - 1]) = 0.0f;
  if (scalar(7) == 0.0f) return 0;
  std::vector<int64_t> offset(count + 1, 0);
  for (int t = 0; t < count; ++t) offset[t + 1] = offset[t] + numel(ndims[kScalars + t], shapes[kScalars + t]);
  parallel_for(offset[count], kGrain, 16, [&](int64_t begin, int64_t end) {
    int t = static_cast<int>(std::upper_bound(offset.begin(), offset.end(), begin) - offset.begin()) - 1;
    for (; t < count && offset[t] < end; ++t) {
      float *var = static_cast<float *>(params[kScalars + t]);
      float *m = static_cast<float *>(params[kScalars + count + t]);
      float *v = static_cast<float *>(params[kScalars + 2 * count + t]);
      const float *gradient = static_cast<const float *>(params[kScalars + 3 * count + t]);
      const float decay = decays[t] * decay_factor;
      const int64_t lo = std::max(begin, offset[t]) - offset[t], hi = std::min(end, offset[t + 1]) - offset[t];
      for (int64_t i = lo; i < hi; ++i) {
        const float g = gradient[i] * unscale * clip;
        const float m_new = m[i] + (g - m[i]) * beta1_minus;
        const float v_new = v[i] + (g * g - v[i]) * beta2_minus;
        m[i] = m_new;
        v[i] = v_new;
        var[i] -= lr * (m_new / (std::sqrt(v_new) + epsilon) + decay * var[i]);
      }
    }
  });
  return 0;
}
