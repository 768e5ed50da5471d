// One-pass AdamW. See optim/fused_adamw.h.
#include "hyperparallel/optim/fused_adamw.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "hyperparallel/optim/state_file.h"

namespace hyperparallel::optim {
namespace {

// The per-step scalars, rounded to fp32 as LibTorch's ops round their scalar arguments.
struct StepScalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bias_correction2, eps, neg_step_size;
  bool decays;
};

StepScalars scalars_for(const torch::optim::AdamWOptions& o, int64_t step) {
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  StepScalars s;
  s.decays = o.weight_decay() != 0;
  s.decay = static_cast<float>(1 - o.lr() * o.weight_decay());
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(o.eps());
  s.neg_step_size = static_cast<float>(-(o.lr() / bias_correction1));
  return s;
}

// The update of elements [begin, end). kFma: the multiply-adds LibTorch's AVX2 / AVX-512
// kernels fuse are fused here too — add_(x, alpha) is fmadd(x, alpha, self) there, and
// addcmul's self + value·t1·t2 is contracted to fma(value·t1, t2, self) — so the loop rounds
// as they do; without FMA (LibTorch's DEFAULT kernels) every product and sum rounds.
template <bool kFma>
inline __attribute__((always_inline)) void update_elements(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
                                                          const StepScalars& s) {
  for (int64_t i = begin; i < end; ++i) {
    float param = s.decays ? p[i] * s.decay : p[i];
    const float grad = g[i];
    const float scaled_avg = m[i] * s.beta1, scaled_sq = v[i] * s.beta2, weighted = s.one_minus_beta2 * grad;
    const float avg = kFma ? std::fma(grad, s.one_minus_beta1, scaled_avg) : scaled_avg + s.one_minus_beta1 * grad;
    const float avg_sq = kFma ? std::fma(weighted, grad, scaled_sq) : scaled_sq + weighted * grad;
    const float denom = std::sqrt(avg_sq) / s.sqrt_bias_correction2 + s.eps;
    param = param + s.neg_step_size * avg / denom;
    m[i] = avg;
    v[i] = avg_sq;
    p[i] = param;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void update_range_fma(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
                                                          const StepScalars& s) {
  update_elements<true>(p, g, m, v, begin, end, s);
}

// LibTorch runs its AVX2 (or AVX-512) kernels where the CPU has AVX2 and FMA, unless
// ATEN_CPU_CAPABILITY=default asks for the portable ones.
bool libtorch_fuses_multiply_adds() {
  const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
  if (capability && std::string(capability) == "default") return false;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

void update_range(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end, const StepScalars& s) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool fused = libtorch_fuses_multiply_adds();
  if (fused) return update_range_fma(p, g, m, v, begin, end, s);
#endif
  update_elements<false>(p, g, m, v, begin, end, s);
}

// Large tensors are split over the intra-op thread count. at::parallel_for cannot do it here:
// it is OpenMP in this LibTorch and inlined into the caller, which is not built with OpenMP.
void fused_update(float* p, const float* g, float* m, float* v, int64_t n, const StepScalars& s) {
  constexpr int64_t kPerThread = 1 << 18;  // ~0.7 ms of work per thread: thread start-up is noise
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), n / kPerThread);
  if (workers <= 1) return update_range(p, g, m, v, 0, n, s);
  std::vector<std::thread> threads;
  const int64_t chunk = (n + workers - 1) / workers;
  for (int64_t w = 1; w < workers; ++w) {
    threads.emplace_back(update_range, p, g, m, v, w * chunk, std::min(n, (w + 1) * chunk), std::cref(s));
  }
  update_range(p, g, m, v, 0, chunk, s);
  for (auto& t : threads) t.join();
}

// LibTorch's tensor-op path, for what the loop does not take.
void unfused_update(at::Tensor& p, const at::Tensor& grad, torch::optim::AdamWParamState& state,
                    const torch::optim::AdamWOptions& o) {
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
  state.exp_avg().mul_(beta1).add_(grad, 1 - beta1);
  state.exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(state.step()));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(state.step()));
  at::Tensor second = state.exp_avg_sq();
  if (o.amsgrad()) {
    if (!state.max_exp_avg_sq().defined()) state.max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    at::maximum_out(state.max_exp_avg_sq(), state.max_exp_avg_sq(), state.exp_avg_sq());
    second = state.max_exp_avg_sq();
  }
  const at::Tensor denom = (second.sqrt() / std::sqrt(bias_correction2)).add_(o.eps());
  p.addcdiv_(state.exp_avg(), denom, -(o.lr() / bias_correction1));
}

bool fusable(const at::Tensor& p, const at::Tensor& grad, const torch::optim::AdamWParamState& state) {
  const auto plain_fp32 = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat && t.is_contiguous() && !t.is_sparse(); };
  return plain_fp32(p) && plain_fp32(grad) && plain_fp32(state.exp_avg()) && plain_fp32(state.exp_avg_sq());
}

}  // namespace

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode grad_on(true);
    loss = closure();
  }
  step_groups(param_groups().size());
  return loss;
}

FusedAdamW::~FusedAdamW() = default;

torch::optim::AdamWParamState& FusedAdamW::state_of(const at::Tensor& p) {
  void* const key = p.unsafeGetTensorImpl();
  auto found = state().find(key);
  if (found == state().end()) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    found = state().emplace(key, std::move(fresh)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*found->second);
}

void FusedAdamW::offload_state(const std::string& dir, const std::vector<int64_t>& extra_numels) {
  std::vector<at::Tensor> params;
  std::vector<int64_t> numels;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    for (const auto& p : param_groups()[g].params()) {
      file_slot_[p.unsafeGetTensorImpl()] = numels.size();
      numels.push_back(p.numel());
      numels.push_back(p.numel());
      params.push_back(p);
    }
  }
  first_extra_slot_ = numels.size();
  extra_numels_ = extra_numels;
  numels.insert(numels.end(), extra_numels.begin(), extra_numels.end());
  file_ = std::make_unique<OptimizerStateFile>(dir, numels);
  for (const auto& p : params) {
    void* const key = p.unsafeGetTensorImpl();
    const size_t slot = file_slot_.at(key);
    if (state().count(key)) {  // existing moments move into the file
      stream_in(p, static_cast<torch::optim::AdamWParamState&>(*state().at(key)));
    } else {  // fresh ones start as the file's zeros, never allocated in memory
      auto fresh = std::make_unique<torch::optim::AdamWParamState>();
      fresh->step(0);
      fresh->exp_avg(file_->tensor(slot, p.sizes()));
      fresh->exp_avg_sq(file_->tensor(slot + 1, p.sizes()));
      state().emplace(key, std::move(fresh));
    }
    file_->release(slot);
    file_->release(slot + 1);
  }
}

at::Tensor FusedAdamW::extra_tensor(size_t k) const {
  if (!file_ || k >= extra_numels_.size()) throw std::logic_error("FusedAdamW::extra_tensor: no extra slot " + std::to_string(k));
  return file_->tensor(first_extra_slot_ + k, {extra_numels_[k]});
}

// Points the state's moments at the file (copying what they held when they live elsewhere,
// as after a checkpoint load) and asks for them to be read in.
void FusedAdamW::stream_in(const at::Tensor& p, torch::optim::AdamWParamState& s) {
  const size_t slot = file_slot_.at(p.unsafeGetTensorImpl());
  file_->will_need(slot);
  file_->will_need(slot + 1);
  file_->will_need(p);  // a parameter that lives in the file (a master shard)
  at::Tensor avg = file_->tensor(slot, p.sizes()), avg_sq = file_->tensor(slot + 1, p.sizes());
  if (s.exp_avg().data_ptr() != avg.data_ptr()) {
    avg.copy_(s.exp_avg());
    avg_sq.copy_(s.exp_avg_sq());
    s.exp_avg(avg);
    s.exp_avg_sq(avg_sq);
  }
}

void FusedAdamW::release_state(const at::Tensor& p) {
  if (!file_) return;
  const size_t slot = file_slot_.at(p.unsafeGetTensorImpl());
  file_->release(slot);
  file_->release(slot + 1);
  file_->release(p);
}

void FusedAdamW::step_groups(size_t count) {
  at::NoGradGuard no_grad;
  for (size_t g = 0; g < count; ++g) {
    auto& group = param_groups()[g];
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    const auto& params = group.params();
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor p = params[i];
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = p.grad();
      auto& s = state_of(p);
      if (file_) {
        stream_in(p, s);
        if (i + 1 < params.size()) {  // read the next parameter's moments ahead
          const size_t next = file_slot_.at(params[i + 1].unsafeGetTensorImpl());
          file_->will_need(next);
          file_->will_need(next + 1);
        }
      }
      s.step(s.step() + 1);
      if (!options.amsgrad() && fusable(p, grad, s)) {
        fused_update(p.data_ptr<float>(), grad.data_ptr<float>(), s.exp_avg().data_ptr<float>(), s.exp_avg_sq().data_ptr<float>(),
                     p.numel(), scalars_for(options, s.step()));
        // Written through its pointer: tell whoever caches a copy of it (FSDP's compute shard)
        // that it changed, as an in-place op would.
        p.unsafeGetTensorImpl()->bump_version();
      } else {
        unfused_update(p, grad, s, options);
      }
      release_state(p);
    }
  }
}

}  // namespace hyperparallel::optim
