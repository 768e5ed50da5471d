// parallelize_module: applies a tensor-parallel plan to a model, from outside.
//
//   tp::ParallelizePlan plan;
//   plan.add("model.layers.*.self_attn.q_proj", tp::ColwiseParallel{});
//   plan.add("model.layers.*.self_attn.o_proj", tp::RowwiseParallel{});
//   tp::ParameterLayouts layouts = tp::parallelize_module(model, mesh["tp"], plan);
//
// Keys are fnmatch globs over the modules' full names ('*' also crosses dots). Entries apply
// in plan order; every module a key matches gets that style (a module may get several: a
// block's PrepareModuleInput and, inside it, its projections' styles). A key that matches
// nothing is a UserError (a typo would otherwise train unsharded). Returns the layout of
// every parameter a style touched; parameters no style touched stay whole (Replicate). The
// split parameters' specs are also recorded on `root` (dtensor/parameter_specs.h), which is
// how fully_shard's state dicts, checkpoints and loaders see global shapes and boxes.
// TP is applied before FSDP (docs/tp.md "Composition order").
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hyperparallel/tp/parallel_styles.h"

namespace hyperparallel::tp {

class ParallelizePlan {
 public:
  template <typename Style>
  ParallelizePlan& add(std::string pattern, Style style) {
    entries_.emplace_back(std::move(pattern), std::make_shared<Style>(std::move(style)));
    return *this;
  }
  const std::vector<std::pair<std::string, std::shared_ptr<const ParallelStyle>>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, std::shared_ptr<const ParallelStyle>>> entries_;
};

struct ParallelizeOptions {
  // Validation mode (tp/placement_checks.h): the same plan, with the placement of every tensor
  // that crosses a module boundary measured and checked; a wrong plan fails with a UserError
  // naming the module, the op, the expected and the actual placement. Bit-identical results,
  // one small all-gather per checked tensor.
  bool validate_placement = false;
  // The model holds one pipeline stage's part (pp/stage_split.h): keys for the parts other
  // stages hold match nothing here, and that is no error.
  bool pipeline_stage = false;
};

// `tp_mesh` is a 1-D mesh (mesh["tp"]).
ParameterLayouts parallelize_module(torch::nn::Module& root, const mesh::DeviceMesh& tp_mesh, const ParallelizePlan& plan,
                                    const ParallelizeOptions& options = {});

}  // namespace hyperparallel::tp
