// Fixed-width float vectors for the CPU kernels (softmax_rows.cpp, fused_swiglu.cpp): GCC's
// vector extensions at 16, 8 and 4 lanes, with loads and stores of whole vectors and of a
// row's tail, bf16 <-> fp32 conversion, and Cephes' single-precision exp (within 2 ulp of expf).
//
// How a kernel uses them: its body is a template over the lane count, forced inline into
// entry points compiled with target("avx512f") (16 lanes), target("avx2,fma") (8) and the
// baseline (4), and each call picks the widest the CPU runs (widest_lanes); run_widest below
// does both for a kernel written as a functor. Each width is then
// lowered to its own instructions: a 16-lane vector compiled for AVX2 is split into scalar
// code by the generic lowering (10x slower), and an "arch=" target (target_clones) refuses the
// inlining. The vectors never cross a call, so the ABI note GCC prints for 64-byte vector
// arguments does not apply (-Wpsabi is off in the files that include this).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#pragma GCC diagnostic ignored "-Wpsabi"

#define HP_INLINE inline __attribute__((always_inline))

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HP_X86_WIDTHS 1
#endif

namespace hyperparallel::models::vector_lanes {

// The widest lane count this CPU runs (16 with AVX-512, 8 with AVX2 + FMA, else 4), or `lanes`
// when it is set (tests run each width).
inline int widest_lanes(int lanes = 0) {
  if (lanes) return lanes;
#ifdef HP_X86_WIDTHS
  if (__builtin_cpu_supports("avx512f")) return 16;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
#endif
  return 4;
}

// The vector types per width (GCC ignores vector_size on a typedef that depends on a template
// parameter, hence one specialisation each).
template <int kLanes>
struct VectorTypes;
template <>
struct VectorTypes<16> {
  typedef float Floats __attribute__((vector_size(64)));
  typedef int32_t Ints __attribute__((vector_size(64)));
  typedef uint32_t Uints __attribute__((vector_size(64)));
  typedef uint16_t Halves __attribute__((vector_size(32)));
};
template <>
struct VectorTypes<8> {
  typedef float Floats __attribute__((vector_size(32)));
  typedef int32_t Ints __attribute__((vector_size(32)));
  typedef uint32_t Uints __attribute__((vector_size(32)));
  typedef uint16_t Halves __attribute__((vector_size(16)));
};
template <>
struct VectorTypes<4> {
  typedef float Floats __attribute__((vector_size(16)));
  typedef int32_t Ints __attribute__((vector_size(16)));
  typedef uint32_t Uints __attribute__((vector_size(16)));
  typedef uint16_t Halves __attribute__((vector_size(8)));
};

template <int kLanes>
struct Lanes {
  using Floats = typename VectorTypes<kLanes>::Floats;
  using Ints = typename VectorTypes<kLanes>::Ints;
  using Uints = typename VectorTypes<kLanes>::Uints;
  using Halves = typename VectorTypes<kLanes>::Halves;

  static HP_INLINE Floats load(const float* p) {
    Floats v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static HP_INLINE void store(float* p, Floats v) { std::memcpy(p, &v, sizeof v); }
  // bf16 (its 16 bits, as c10::BFloat16 stores them) widened to fp32: exact.
  static HP_INLINE Floats load_bf16(const uint16_t* p) {
    Halves h;
    std::memcpy(&h, p, sizeof h);
    const Uints bits = __builtin_convertvector(h, Uints) << 16;
    Floats v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  // fp32 to the nearest bf16, ties to even, NaN to a quiet NaN: c10::BFloat16's rounding.
  static HP_INLINE void store_bf16(uint16_t* p, Floats v) {
    Uints bits;
    std::memcpy(&bits, &v, sizeof bits);
    Uints rounded = (bits + (((bits >> 16) & 1u) + 0x7FFFu)) >> 16;
    rounded = v != v ? Uints{} + 0x7FC0u : rounded;
    const Halves h = __builtin_convertvector(rounded, Halves);
    std::memcpy(p, &h, sizeof h);
  }
  static HP_INLINE Floats splat(float x) { return Floats{} + x; }
  static HP_INLINE Floats max(Floats a, Floats b) { return a > b ? a : b; }
  static HP_INLINE float max_of(Floats v) {
    float m = v[0];
    for (int l = 1; l < kLanes; ++l) m = std::max(m, v[l]);
    return m;
  }
  static HP_INLINE float sum_of(Floats v) {
    float s = 0;
    for (int l = 0; l < kLanes; ++l) s += v[l];
    return s;
  }
  // e^x for x <= 0 (a score minus its row's maximum): Cephes' expf, 2^n p(r); 0 below -87,
  // NaN for NaN (the clamp keeps it: a comparison with NaN is false).
  static HP_INLINE Floats exp_nonpositive(Floats x) {
    const Floats clamped = x < -87.0f ? splat(-87.0f) : x;
    const Floats fx = clamped * 1.44269504088896341f + 0.5f;
    Ints n = __builtin_convertvector(fx, Ints);      // rounds toward zero ...
    n += (__builtin_convertvector(n, Floats) > fx);  // ... minus one where that rounded up: floor
    const Floats nf = __builtin_convertvector(n, Floats);
    const Floats r = clamped - nf * 0.693359375f + nf * 2.12194440e-4f;
    Floats p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const Ints bits = (n + 127) << 23;
    Floats two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    return x < -87.0f ? Floats{} : p * two_n;
  }
  // 1 / (1 + e^-x), from e^-|x| so the exp never overflows; NaN for NaN.
  static HP_INLINE Floats sigmoid(Floats x) {
    const Floats t = exp_nonpositive(x < 0.0f ? x : -x);
    return x < 0.0f ? t / (1.0f + t) : 1.0f / (1.0f + t);
  }
  // The row's tail (fewer than kLanes entries) through one vector padded with `pad`.
  static HP_INLINE Floats load_tail(const float* p, int64_t n, float pad) {
    float buffer[kLanes];
    for (int l = 0; l < kLanes; ++l) buffer[l] = l < n ? p[l] : pad;
    return load(buffer);
  }
  static HP_INLINE void store_tail(float* p, int64_t n, Floats v) {
    for (int64_t l = 0; l < n; ++l) p[l] = v[l];
  }
  // A bf16 row widened into fp32 (exact), and an fp32 row rounded to bf16, n elements.
  static HP_INLINE void widen_row(const uint16_t* in, int64_t n, float* out) {
    const int64_t body = n - n % kLanes;
    for (int64_t j = 0; j < body; j += kLanes) store(out + j, load_bf16(in + j));
    for (int64_t j = body; j < n; ++j) {
      const uint32_t bits = static_cast<uint32_t>(in[j]) << 16;
      std::memcpy(out + j, &bits, sizeof bits);
    }
  }
  static HP_INLINE void round_row(const float* in, int64_t n, uint16_t* out) {
    const int64_t body = n - n % kLanes;
    for (int64_t j = 0; j < body; j += kLanes) store_bf16(out + j, load(in + j));
    if (body == n) return;
    uint16_t tail[kLanes];
    store_bf16(tail, load_tail(in + body, n - body, 0.0f));
    for (int64_t j = body; j < n; ++j) out[j] = tail[j - body];
  }
};

// Runs body.template run<kLanes>() at the widest width the CPU runs (or at `lanes`), inlined
// into an entry point compiled for that width's instructions (the pattern in the header note):
// a kernel writes its rows once as a functor with an HP_INLINE member template run<kLanes>().
#ifdef HP_X86_WIDTHS
template <class Body>
__attribute__((target("avx512f"))) void run_16_lanes(const Body& body) {
  body.template run<16>();
}
template <class Body>
__attribute__((target("avx2,fma"))) void run_8_lanes(const Body& body) {
  body.template run<8>();
}
#endif

template <class Body>
void run_widest(int lanes, const Body& body) {
  switch (widest_lanes(lanes)) {
#ifdef HP_X86_WIDTHS
    case 16:
      return run_16_lanes(body);
    case 8:
      return run_8_lanes(body);
#endif
    default:
      return body.template run<4>();
  }
}

}  // namespace hyperparallel::models::vector_lanes
