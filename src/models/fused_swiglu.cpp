// The fused SwiGLU kernels, their autograd function and the MLP that uses them. See fused_swiglu.h.
#include "fused_swiglu.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <type_traits>

#include "hyperparallel/platform/user_error.h"
#include "vector_lanes.h"

namespace hyperparallel::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using vector_lanes::Lanes;

constexpr int64_t kElementsPerTask = 1 << 14;

// Element access for fp32 and bf16 (its raw 16 bits): a kernel body is written once over T.
template <int kLanes>
struct Io {
  using L = Lanes<kLanes>;
  using Floats = typename L::Floats;
  static HP_INLINE Floats load(const float* p) { return L::load(p); }
  static HP_INLINE Floats load(const uint16_t* p) { return L::load_bf16(p); }
  static HP_INLINE void store(float* p, Floats v) { L::store(p, v); }
  static HP_INLINE void store(uint16_t* p, Floats v) { L::store_bf16(p, v); }
};

// The n % kLanes elements past the vectors, through one vector: staged in fp32 or bf16 buffers.
template <int kLanes, typename T>
HP_INLINE void stage_tail(const T* src, int64_t n, T* buffer) {
  for (int64_t l = 0; l < kLanes; ++l) buffer[l] = l < n ? src[l] : T{};
}

template <int kLanes, typename T>
HP_INLINE typename Lanes<kLanes>::Floats forward_lanes(const T* g, const T* u) {
  const auto gv = Io<kLanes>::load(g);
  return gv * Lanes<kLanes>::sigmoid(gv) * Io<kLanes>::load(u);
}

template <int kLanes, typename T>
HP_INLINE void forward_body(const T* g, const T* u, T* h, int64_t n) {
  const int64_t body = n - n % kLanes;
  for (int64_t i = 0; i < body; i += kLanes) Io<kLanes>::store(h + i, forward_lanes<kLanes>(g + i, u + i));
  if (body == n) return;
  T gt[kLanes], ut[kLanes], ht[kLanes];
  stage_tail<kLanes>(g + body, n - body, gt);
  stage_tail<kLanes>(u + body, n - body, ut);
  Io<kLanes>::store(ht, forward_lanes<kLanes>(gt, ut));
  for (int64_t i = body; i < n; ++i) h[i] = ht[i - body];
}

template <int kLanes, typename T>
HP_INLINE void backward_lanes(const T* g, const T* u, const T* dh, T* dg, T* du) {
  using Floats = typename Lanes<kLanes>::Floats;
  const Floats gv = Io<kLanes>::load(g), uv = Io<kLanes>::load(u), dhv = Io<kLanes>::load(dh);
  const Floats s = Lanes<kLanes>::sigmoid(gv);
  Io<kLanes>::store(du, dhv * gv * s);
  Io<kLanes>::store(dg, dhv * uv * s * (1.0f + gv * (1.0f - s)));
}

template <int kLanes, typename T>
HP_INLINE void backward_body(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t n) {
  const int64_t body = n - n % kLanes;
  for (int64_t i = 0; i < body; i += kLanes) backward_lanes<kLanes>(g + i, u + i, dh + i, dg + i, du + i);
  if (body == n) return;
  T gt[kLanes], ut[kLanes], dht[kLanes], dgt[kLanes], dut[kLanes];
  stage_tail<kLanes>(g + body, n - body, gt);
  stage_tail<kLanes>(u + body, n - body, ut);
  stage_tail<kLanes>(dh + body, n - body, dht);
  backward_lanes<kLanes>(gt, ut, dht, dgt, dut);
  for (int64_t i = body; i < n; ++i) dg[i] = dgt[i - body], du[i] = dut[i - body];
}

// The kernels as functors for vector_lanes::run_widest (one entry point per width).
template <typename T>
struct ForwardElements {
  const T *g, *u;
  T* h;
  int64_t n;
  template <int kLanes>
  HP_INLINE void run() const {
    forward_body<kLanes>(g, u, h, n);
  }
};

template <typename T>
struct BackwardElements {
  const T *g, *u, *dh;
  T *dg, *du;
  int64_t n;
  template <int kLanes>
  HP_INLINE void run() const {
    backward_body<kLanes>(g, u, dh, dg, du, n);
  }
};

template <typename T>
void forward_at(const T* g, const T* u, T* h, int64_t n, int lanes) {
  vector_lanes::run_widest(lanes, ForwardElements<T>{g, u, h, n});
}

template <typename T>
void backward_at(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t n, int lanes) {
  vector_lanes::run_widest(lanes, BackwardElements<T>{g, u, dh, dg, du, n});
}

// The element pointers of a contiguous fp32 or bf16 tensor, as the kernels take them.
template <typename T>
T* elements(const at::Tensor& t) {
  if constexpr (std::is_same_v<T, float>) return t.data_ptr<float>(); else return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
}

template <typename T>
at::Tensor forward_tensor(const at::Tensor& g, const at::Tensor& u) {
  at::Tensor h = at::empty_like(g);
  const T *gp = elements<T>(g), *up = elements<T>(u);
  T* hp = elements<T>(h);
  at::parallel_for(0, g.numel(), kElementsPerTask, [&](int64_t begin, int64_t end) { forward_at(gp + begin, up + begin, hp + begin, end - begin, 0); });
  return h;
}

template <typename T>
std::pair<at::Tensor, at::Tensor> backward_tensors(const at::Tensor& g, const at::Tensor& u, const at::Tensor& dh) {
  at::Tensor dg = at::empty_like(g), du = at::empty_like(u);
  const T *gp = elements<T>(g), *up = elements<T>(u), *dhp = elements<T>(dh);
  T *dgp = elements<T>(dg), *dup = elements<T>(du);
  at::parallel_for(0, g.numel(), kElementsPerTask, [&](int64_t begin, int64_t end) {
    backward_at(gp + begin, up + begin, dhp + begin, dgp + begin, dup + begin, end - begin, 0);
  });
  return {dg, du};
}

struct SwiGLUFunction : torch::autograd::Function<SwiGLUFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    const at::Tensor g = gate.contiguous(), u = up.contiguous();
    ctx->save_for_backward({g, u});
    return g.scalar_type() == at::kFloat ? forward_tensor<float>(g, u) : forward_tensor<uint16_t>(g, u);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor dh = grads[0].contiguous().to(saved[0].scalar_type());
    const auto [dg, du] = saved[0].scalar_type() == at::kFloat ? backward_tensors<float>(saved[0], saved[1], dh)
                                                               : backward_tensors<uint16_t>(saved[0], saved[1], dh);
    return {dg, du};
  }
};

}  // namespace

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  const bool fused_dtype = gate.scalar_type() == at::kFloat || gate.scalar_type() == at::kBFloat16;
  if (gate.device().is_cpu() && fused_dtype && up.scalar_type() == gate.scalar_type() && up.sizes() == gate.sizes() &&
      up.device().is_cpu()) {
    return SwiGLUFunction::apply(gate, up);
  }
  return at::silu(gate) * up;
}

void swiglu_forward(const float* g, const float* u, float* h, int64_t n, int lanes) { forward_at(g, u, h, n, lanes); }

void swiglu_backward(const float* g, const float* u, const float* dh, float* dg, float* du, int64_t n, int lanes) {
  backward_at(g, u, dh, dg, du, n, lanes);
}

FusedSwiGLUMlp::FusedSwiGLUMlp(Mlp& original) : FeedForwardModule("FusedSwiGLUMlp") {
  gate_proj_ = register_module("gate_proj", original.gate_proj);
  up_proj_ = register_module("up_proj", original.up_proj);
  down_proj_ = register_module("down_proj", original.down_proj);
}

at::Tensor FusedSwiGLUMlp::forward(const at::Tensor& x, std::vector<at::Tensor>*) {
  return down_proj_->forward(swiglu(gate_proj_->forward(x), up_proj_->forward(x)));
}

std::shared_ptr<torch::nn::Module> make_fused_swiglu_mlp(torch::nn::Module& original, const ModelConfig&) {
  auto* mlp = dynamic_cast<Mlp*>(&original);
  if (!mlp) throw UserError("fused_swiglu_mlp replaces gated MLP modules (e.g. Qwen3MLP), not " + original.name());
  return std::make_shared<FusedSwiGLUMlp>(*mlp);
}

}  // namespace hyperparallel::models
