// Sharded training checkpoints. See train/checkpoint.h.
#include "hyperparallel/train/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "hyperparallel/data/tokenizer.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/io/safetensors.h"
#include "hyperparallel/platform/fault_injection.h"
#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/user_error.h"
#include "io/atomic_write.h"

namespace hyperparallel::train {
namespace {

namespace fs = std::filesystem;
constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kPrefix = "checkpoint-";

std::string rank_file(int rank) { return "rank-" + std::to_string(rank) + ".safetensors"; }

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// FNV-1a 64 of a file's bytes, as 16 hex digits.
std::string file_checksum(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot read " + path);
  uint64_t h = 1469598103934665603ull;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      h ^= static_cast<unsigned char>(buffer[static_cast<size_t>(i)]);
      h *= 1099511628211ull;
    }
  }
  return hex64(h);
}

torch::optim::AdamWParamState* adam_state(torch::optim::AdamW& optimizer, const at::Tensor& param) {
  auto it = optimizer.state().find(param.unsafeGetTensorImpl());
  return it == optimizer.state().end() ? nullptr : static_cast<torch::optim::AdamWParamState*>(it->second.get());
}

// The parameters the optimizer updates, by full name.
std::map<std::string, at::Tensor> optimizer_params(torch::nn::Module& model, torch::optim::AdamW& optimizer) {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : model.named_parameters()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  std::map<std::string, at::Tensor> out;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = names.find(p.unsafeGetTensorImpl());
      if (it != names.end()) out.emplace(it->second, p);
    }
  }
  return out;
}

bool is_complete(const fs::path& dir) { return fs::is_regular_file(dir / kStateFile); }

int64_t step_of(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const std::string digits = name.substr(std::string(kPrefix).size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 15) return -1;
  return std::stoll(digits);
}

nlohmann::json info_json(const CheckpointInfo& info) {
  return {{"step", info.step},           {"sampler_position", info.sampler_position}, {"global_batch_rows", info.global_batch_rows},
          {"data_rows", info.data_rows}, {"seed", info.seed},                         {"world_size", info.world_size},
          {"mesh_shape", info.mesh_shape}, {"model", info.model}, {"input_tokens", info.input_tokens}};
}

// Every piece of every tensor in a checkpoint's rank files, and reads of any box of them.
class ShardReader {
 public:
  ShardReader(const std::string& dir, const std::vector<std::string>& checksums, int own_rank) {
    for (int r = 0; r < static_cast<int>(checksums.size()); ++r) {
      const std::string path = (fs::path(dir) / rank_file(r)).string();
      if (!fs::is_regular_file(path)) throw UserError("checkpoint " + dir + " is missing " + rank_file(r) + "; it is damaged");
      if (file_checksum(path) != checksums[static_cast<size_t>(r)]) {
        throw UserError("checkpoint file " + path + " does not match its checksum in " + kStateFile +
                        "; the checkpoint is damaged, resume from another one");
      }
      files_.push_back(std::make_unique<io::SafetensorsFile>(path));
      const auto meta = files_.back()->metadata();
      const auto found = meta.find("shards");
      if (found == meta.end()) throw UserError("checkpoint file " + path + " has no shard table; it is damaged");
      const nlohmann::json table = nlohmann::json::parse(found->second, nullptr, false);
      if (!table.is_object()) throw UserError("checkpoint file " + path + " has a damaged shard table");
      for (const auto& [name, s] : table.items()) {
        Piece piece{static_cast<size_t>(r), s.at("global_shape").get<std::vector<int64_t>>(), {}, s.value("step", int64_t{0})};
        if (s.contains("offsets")) {
          piece.box = {s.at("offsets").get<std::vector<int64_t>>(), s.at("lengths").get<std::vector<int64_t>>()};
        } else {  // written before N-D boxes: rows of one dim
          const int64_t dim = s.at("shard_dim").get<int64_t>();
          piece.box = {std::vector<int64_t>(piece.global_shape.size(), 0), files_.back()->entry("param/" + name).shape};
          if (!piece.global_shape.empty()) piece.box.offsets[static_cast<size_t>(dim)] = s.at("row_offset").get<int64_t>();
        }
        // The own rank's piece first: on an unchanged layout every read is one piece. A box
        // seen already (replicas in checkpoints written before pieces were written once) is
        // the same data: keep one.
        auto& list = pieces_[name];
        const auto same = std::find_if(list.begin(), list.end(), [&](const Piece& p) { return p.box == piece.box; });
        if (same != list.end()) {
          if (r == own_rank) *same = piece;
          continue;
        }
        list.insert(r == own_rank ? list.begin() : list.end(), piece);
      }
    }
  }

  bool has(const std::string& kind, const std::string& name) const {
    for (const Piece& p : pieces_of(name)) {
      if (files_[p.file]->contains(kind + "/" + name)) return true;
    }
    return false;
  }
  int64_t step_of(const std::string& name) const { return pieces_of(name).front().step; }
  const std::vector<int64_t>& global_shape(const std::string& name) const { return pieces_of(name).front().global_shape; }

  // The box `want` of `kind`/`name` (kind: param, exp_avg, exp_avg_sq), from one piece when
  // one holds it, else assembled from every piece it overlaps.
  at::Tensor box(const std::string& kind, const std::string& name, const dtensor::Box& want) const {
    const std::string key = kind + "/" + name;
    const auto& pieces = pieces_of(name);
    for (const Piece& p : pieces) {
      if (contains(p.box, want) && files_[p.file]->contains(key)) {
        return files_[p.file]->read_box(key, relative(want.offsets, p.box), want.lengths);
      }
    }
    at::Tensor out;
    int64_t covered = 0;
    for (const Piece& p : pieces) {
      dtensor::Box common;
      if (!files_[p.file]->contains(key) || !intersect(p.box, want, &common)) continue;
      const at::Tensor part = files_[p.file]->read_box(key, relative(common.offsets, p.box), common.lengths);
      if (!out.defined()) out = at::zeros(want.lengths, part.options());
      at::Tensor target = out;
      for (size_t d = 0; d < want.offsets.size(); ++d) {
        target = target.narrow(static_cast<int64_t>(d), common.offsets[d] - want.offsets[d], common.lengths[d]);
      }
      target.copy_(part);
      covered += part.numel();
    }
    if (!out.defined() || covered != out.numel()) {
      throw UserError("the checkpoint does not hold all of " + key + " that this rank needs; it is damaged or incomplete");
    }
    return out;
  }

  at::Tensor rng_state(int rank) const {
    if (rank >= static_cast<int>(files_.size())) return {};
    return files_[static_cast<size_t>(rank)]->contains("rng/cpu") ? files_[static_cast<size_t>(rank)]->read("rng/cpu") : at::Tensor();
  }

 private:
  struct Piece {
    size_t file;
    std::vector<int64_t> global_shape;
    dtensor::Box box;
    int64_t step;
  };
  static bool contains(const dtensor::Box& outer, const dtensor::Box& inner) {
    for (size_t d = 0; d < outer.offsets.size(); ++d) {
      if (inner.offsets[d] < outer.offsets[d] || inner.offsets[d] + inner.lengths[d] > outer.offsets[d] + outer.lengths[d]) return false;
    }
    return true;
  }
  static bool intersect(const dtensor::Box& a, const dtensor::Box& b, dtensor::Box* out) {
    *out = a;
    for (size_t d = 0; d < a.offsets.size(); ++d) {
      const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
      const int64_t hi = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
      if (hi <= lo) return false;
      out->offsets[d] = lo;
      out->lengths[d] = hi - lo;
    }
    return true;
  }
  static std::vector<int64_t> relative(const std::vector<int64_t>& offsets, const dtensor::Box& piece) {
    std::vector<int64_t> out = offsets;
    for (size_t d = 0; d < out.size(); ++d) out[d] -= piece.offsets[d];
    return out;
  }
  const std::vector<Piece>& pieces_of(const std::string& name) const {
    auto it = pieces_.find(name);
    if (it == pieces_.end()) {
      throw UserError("the checkpoint has no parameter " + name + "; it was written by another model");
    }
    return it->second;
  }
  std::vector<std::unique_ptr<io::SafetensorsFile>> files_;
  std::map<std::string, std::vector<Piece>> pieces_;
};

// Which of this rank's pieces it writes: the first rank (in world order) holding a given box
// of a tensor writes it, so HSDP replicas and tp ranks that hold the same piece do not write
// it again. Ranks may hold different tensors (expert parallelism), so a piece is known by a
// hash of its name and box; one all-gather of every rank's hashes (padded to the longest list).
std::vector<bool> pieces_to_write(const std::map<std::string, fsdp::ShardedTensor>& shards, comm::Communicator& world) {
  std::vector<int64_t> hashes;
  for (const auto& [name, shard] : shards) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
    for (const auto* v : {&shard.offsets, &shard.lengths}) {
      for (int64_t x : *v) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
    }
    hashes.push_back(static_cast<int64_t>(h));
  }
  at::Tensor counts = at::zeros({world.size()}, at::kLong);
  world.all_gather(counts, at::full({1}, static_cast<int64_t>(hashes.size()), at::kLong)).wait();
  const int64_t n = counts.max().item<int64_t>();
  at::Tensor mine = at::zeros({n}, at::kLong);
  if (!hashes.empty()) mine.narrow(0, 0, static_cast<int64_t>(hashes.size())).copy_(at::tensor(hashes, at::kLong));
  at::Tensor all = at::zeros({world.size() * n}, at::kLong);
  world.all_gather(all, mine).wait();
  std::set<int64_t> earlier;  // pieces ranks before this one write
  const auto* table = all.data_ptr<int64_t>();
  for (int r = 0; r < world.rank(); ++r) earlier.insert(table + r * n, table + r * n + counts[r].item<int64_t>());
  std::vector<bool> write;
  size_t i = 0;
  for (const auto& item : shards) write.push_back(item.second.local.numel() > 0 && !earlier.count(hashes[i++]));
  return write;
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    const int64_t step = step_of(entry.path());
    if (step >= 0 && entry.is_directory() && is_complete(entry.path())) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string save_checkpoint(const std::string& output_dir, const CheckpointInfo& info, const CheckpointExtras& extras,
                            torch::nn::Module& model, torch::optim::AdamW& optimizer, comm::Communicator& world,
                            int64_t save_total_limit) {
  const fs::path final_dir = fs::path(output_dir) / (kPrefix + std::to_string(info.step));
  const fs::path partial = final_dir.string() + ".partial";
  if (world.rank() == 0) {
    fs::remove_all(partial);
    fs::create_directories(partial);
  }
  world.barrier().wait();

  // This rank's pieces: parameters, AdamW moments, RNG.
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json shards = nlohmann::json::object();
  const auto params = optimizer_params(model, optimizer);
  const auto state_dict = fsdp::sharded_state_dict(model);
  const std::vector<bool> write = pieces_to_write(state_dict, world);
  size_t index = 0;
  for (const auto& [name, shard] : state_dict) {
    if (!write[index++]) continue;
    nlohmann::json s = {{"global_shape", shard.global_shape}, {"offsets", shard.offsets}, {"lengths", shard.lengths}};
    tensors.emplace_back("param/" + name, shard.local.contiguous());
    auto p = params.find(name);
    if (p != params.end()) {
      if (auto* state = adam_state(optimizer, p->second)) {
        tensors.emplace_back("exp_avg/" + name, state->exp_avg().reshape(shard.local.sizes()).contiguous());
        tensors.emplace_back("exp_avg_sq/" + name, state->exp_avg_sq().reshape(shard.local.sizes()).contiguous());
        s["step"] = state->step();
      }
    }
    shards[name] = s;
  }
  tensors.emplace_back("rng/cpu", at::detail::getDefaultCPUGenerator().get_state());
  const std::string mine = (partial / rank_file(world.rank())).string();
  try {
    io::write_safetensors(mine, tensors, {{"format", "pt"}, {"shards", shards.dump()}});
    if (world.options().faults) world.options().faults->pass("checkpoint_file_written", world.global_rank());
  } catch (...) {
    // A failed save (a full disk, say) must not leave its pieces behind: they would keep the
    // disk full for the resume. The next run's start sweeps what other ranks left.
    std::error_code ec;
    fs::remove(mine, ec);
    if (world.rank() == 0) fs::remove_all(partial, ec);
    throw;
  }

  // Every rank's checksum and size to rank 0, which writes the state file last and renames.
  const std::string sum = file_checksum(mine);
  at::Tensor local = at::tensor({static_cast<int64_t>(std::stoull(sum, nullptr, 16)), static_cast<int64_t>(fs::file_size(mine))}, at::kLong);
  at::Tensor all = at::zeros({2 * world.size()}, at::kLong);
  world.all_gather(all, local).wait();
  if (world.rank() == 0) {
    nlohmann::json state = info_json(info);
    state["files"] = nlohmann::json::array();
    for (int r = 0; r < world.size(); ++r) {
      state["files"].push_back({{"name", rank_file(r)},
                                {"bytes", all[2 * r + 1].item<int64_t>()},
                                {"fnv1a64", hex64(static_cast<uint64_t>(all[2 * r].item<int64_t>()))}});
    }
    try {
      if (!extras.config_json.empty()) io::write_file_atomically((partial / "config.json").string(), extras.config_json);
      if (!extras.tokenizer_dir.empty()) data::copy_tokenizer_files(extras.tokenizer_dir, partial.string());
      io::write_file_atomically((partial / kStateFile).string(), state.dump(2) + "\n");
    } catch (...) {
      std::error_code ec;
      fs::remove_all(partial, ec);
      throw;
    }
    fs::remove_all(final_dir);
    fs::rename(partial, final_dir);
    if (save_total_limit > 0) {
      std::vector<std::string> older;  // this run's line: steps up to the one just written
      for (const auto& dir : list_checkpoints(output_dir)) {
        if (step_of(dir) <= info.step) older.push_back(dir);
      }
      for (size_t i = 0; i + static_cast<size_t>(save_total_limit) < older.size(); ++i) fs::remove_all(older[i]);
    }
  }
  world.barrier().wait();
  return final_dir.string();
}

std::vector<std::string> remove_unfinished_saves(const std::string& output_dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool partial = name.rfind(kPrefix, 0) == 0 && name.size() > 8 && name.compare(name.size() - 8, 8, ".partial") == 0;
    if (partial && entry.is_directory()) removed.push_back(entry.path().string());
  }
  for (const auto& dir : removed) fs::remove_all(dir, ec);
  return removed;
}

std::vector<std::string> supersede_later_checkpoints(const std::string& output_dir, int64_t step) {
  std::vector<std::string> renamed;
  for (const auto& dir : list_checkpoints(output_dir)) {
    if (step_of(dir) <= step) continue;
    std::string target = dir + ".superseded-" + std::to_string(step);
    for (int n = 2; fs::exists(target); ++n) target = dir + ".superseded-" + std::to_string(step) + "-" + std::to_string(n);
    fs::rename(dir, target);
    renamed.push_back(target);
  }
  return renamed;
}

std::string resolve_checkpoint(const std::string& spec, const std::string& output_dir) {
  if (spec == "latest") {
    const auto found = list_checkpoints(output_dir);
    if (found.empty()) {
      throw UserError("resume_from_checkpoint: latest, but output_dir " + output_dir +
                      " has no complete checkpoint-<step> folder; train with save_steps first or give a path");
    }
    return found.back();
  }
  if (!fs::is_directory(spec)) throw UserError("resume_from_checkpoint: " + spec + " is not a folder; give a checkpoint-<step> folder or latest");
  if (!is_complete(spec)) {
    throw UserError("resume_from_checkpoint: " + spec + " has no " + kStateFile +
                    " (an unfinished or damaged save); use an earlier checkpoint or latest");
  }
  return spec;
}

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  const std::string path = (fs::path(dir) / kStateFile).string();
  if (!fs::exists(path)) throw UserError("cannot read " + path + "; is " + dir + " a checkpoint folder?");
  const nlohmann::json j = io::read_user_json(path, io::kMaxSmallJsonBytes, "the checkpoint state");
  try {
    CheckpointInfo info;
    info.step = j.at("step").get<int64_t>();
    info.sampler_position = j.at("sampler_position");
    info.global_batch_rows = j.at("global_batch_rows").get<int64_t>();
    info.data_rows = j.at("data_rows").get<int64_t>();
    info.seed = j.at("seed").get<int64_t>();
    info.world_size = j.at("world_size").get<int64_t>();
    info.mesh_shape = j.at("mesh_shape").get<std::vector<int64_t>>();
    info.model = j.at("model").get<std::string>();
    info.input_tokens = j.value("input_tokens", int64_t{0});  // absent in checkpoints written before it was recorded
    if (j.at("files").size() != static_cast<size_t>(info.world_size)) throw UserError("files does not list one file per rank");
    for (const auto& f : j.at("files")) info.file_checksums.push_back(f.at("fnv1a64").get<std::string>());
    return info;
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path + " is damaged (" + e.what() + "); use another checkpoint");
  } catch (const UserError& e) {
    throw UserError(path + " is damaged (" + e.what() + "); use another checkpoint");
  }
}

CheckpointInfo load_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::AdamW* optimizer, int world_rank) {
  const CheckpointInfo info = read_checkpoint_info(dir);
  const ShardReader reader(dir, info.file_checksums, world_rank);

  const auto shapes = fsdp::full_parameter_shapes(model);
  for (const auto& [name, shape] : shapes) {
    if (reader.global_shape(name) != shape) {
      throw UserError("checkpoint parameter " + name + " has another shape than the model's; it was written by another model");
    }
  }
  fsdp::load_parameters(model, [&](const std::string& name, const dtensor::Box& box) { return reader.box("param", name, box); });
  if (optimizer) {
    const auto params = optimizer_params(model, *optimizer);
    optimizer->state().clear();
    for (const auto& [name, shard] : fsdp::sharded_state_dict(model)) {
      auto p = params.find(name);
      if (p == params.end() || !reader.has("exp_avg", name)) continue;
      const dtensor::Box box{shard.offsets, shard.lengths};
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(reader.step_of(name));
      if (shard.local.numel() == 0) {
        state->exp_avg(at::zeros_like(shard.local));
        state->exp_avg_sq(at::zeros_like(shard.local));
      } else {
        state->exp_avg(reader.box("exp_avg", name, box).reshape(shard.local.sizes()).to(at::kFloat).clone());
        state->exp_avg_sq(reader.box("exp_avg_sq", name, box).reshape(shard.local.sizes()).to(at::kFloat).clone());
      }
      optimizer->state()[p->second.unsafeGetTensorImpl()] = std::move(state);
    }
    const at::Tensor rng = reader.rng_state(world_rank);
    if (rng.defined()) {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      generator.set_state(rng);
    }
  }
  return info;
}

}  // namespace hyperparallel::train
