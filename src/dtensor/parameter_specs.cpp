#include "hyperparallel/dtensor/parameter_specs.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <set>

namespace hyperparallel::dtensor {
namespace {

constexpr const char* kSpecsChild = "_hp_parameter_specs";

class SpecTable : public torch::nn::Module {
 public:
  std::map<std::string, DTensorSpec> specs;
  std::map<std::string, ParameterOwner> owners;
};

SpecTable* find_table(torch::nn::Module& root) {
  for (const auto& child : root.named_children()) {
    if (child.key() == kSpecsChild) return dynamic_cast<SpecTable*>(child.value().get());
  }
  return nullptr;
}

SpecTable& table_of(torch::nn::Module& root) {
  SpecTable* table = find_table(root);
  return table ? *table : *root.register_module(kSpecsChild, std::make_shared<SpecTable>());
}

}  // namespace

void record_parameter_spec(torch::nn::Module& root, const std::string& name, const DTensorSpec& spec) {
  SpecTable& table = table_of(root);
  table.specs.erase(name);
  table.specs.emplace(name, spec);
}

const DTensorSpec* find_parameter_spec(torch::nn::Module& root, const std::string& name) {
  SpecTable* table = find_table(root);
  if (!table) return nullptr;
  const auto it = table->specs.find(name);
  return it == table->specs.end() ? nullptr : &it->second;
}

const std::map<std::string, DTensorSpec>& parameter_specs(torch::nn::Module& root) {
  static const std::map<std::string, DTensorSpec> kNone;  // an immutable empty map, not state
  SpecTable* table = find_table(root);
  return table ? table->specs : kNone;
}

Box parameter_box(torch::nn::Module& root, const std::string& name, const std::vector<int64_t>& local_shape) {
  const DTensorSpec* spec = find_parameter_spec(root, name);
  if (!spec) return Box{std::vector<int64_t>(local_shape.size(), 0), local_shape};
  return spec->local_box();
}

void record_parameter_owner(torch::nn::Module& root, const std::string& name, const ParameterOwner& owner) {
  table_of(root).owners[name] = owner;
}

const std::map<std::string, ParameterOwner>& parameter_owners(torch::nn::Module& root) {
  static const std::map<std::string, ParameterOwner> kNone;  // an immutable empty map, not state
  SpecTable* table = find_table(root);
  return table ? table->owners : kNone;
}

std::vector<std::string> full_parameter_names(torch::nn::Module& root) {
  const auto& owners = parameter_owners(root);
  std::vector<std::string> out;
  std::set<std::string> sets_done;
  for (const auto& item : root.named_parameters()) {
    const auto it = owners.find(item.key());
    if (it == owners.end()) {
      out.push_back(item.key());
      continue;
    }
    if (!sets_done.insert(it->second.set).second) continue;
    std::vector<std::pair<int64_t, std::string>> members;
    for (const auto& [name, owner] : owners) {
      if (owner.set == it->second.set) members.emplace_back(owner.order, name);
    }
    std::sort(members.begin(), members.end());
    for (auto& m : members) out.push_back(std::move(m.second));
  }
  return out;
}

}  // namespace hyperparallel::dtensor
