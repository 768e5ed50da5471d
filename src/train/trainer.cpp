// The SFT training loop. See train/trainer.h.
#include "hyperparallel/train/trainer.h"

#include <sys/resource.h>
#include <unistd.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <ostream>

#include "hyperparallel/cp/cp_options.h"
#include "hyperparallel/data/batch_sampler.h"
#include "hyperparallel/fsdp/clip_grad_norm.h"
#include "hyperparallel/fsdp/fully_shard.h"
#include "hyperparallel/mesh/device_mesh.h"
#include "hyperparallel/models/activation_checkpoint.h"
#include "hyperparallel/models/auto_model.h"
#include "hyperparallel/models/model_config.h"
#include "hyperparallel/optim/fused_adamw.h"
#include "hyperparallel/optim/muon.h"
#include "hyperparallel/optim/state_file.h"
#include "hyperparallel/platform/bf16_matmul.h"
#include "hyperparallel/platform/cpu_features.h"
#include "hyperparallel/platform/user_error.h"
#include "hyperparallel/pp/stage_split.h"
#include "hyperparallel/train/checkpoint.h"
#include "hyperparallel/train/lr_schedule.h"
#include "eval_loss.h"
#include "heldout_eval.h"
#include "loss_chunking.h"
#include "hf_outputs.h"
#include "optimizer_setup.h"
#include "output_dir.h"
#include "parallelize.h"
#include "pipeline_training.h"
#include "step_trace.h"
#include "train_data.h"
#include "train_metrics.h"
#include "tensorboard_writer.h"
#include "train_output.h"
#include "train_step.h"

namespace hyperparallel::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// eval_steps: a count, or (below 1) a fraction of the run, as HF reads it; unset: logging_steps.
int64_t resolve_eval_steps(const TrainConfig& c, int64_t total_steps) {
  if (c.eval_steps <= 0) return c.logging_steps;
  if (c.eval_steps < 1) return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(c.eval_steps * static_cast<double>(total_steps))));
  return static_cast<int64_t>(c.eval_steps);
}

// Held-out accuracy (printed by rank 0, with a few answers after training), then every unit
// back to its sharded state (a forward without backward leaves the root, and with
// reshard_after_forward off every unit, unsharded).
double evaluate_and_report(const char* when, models::CausalLM& model, const TrainData& data, const TrainConfig& c,
                           const ParallelLayout& layout,
                           comm::Communicator& world, std::vector<fsdp::FSDPModule>& units, std::ostream& log) {
  const HeldoutScore score = evaluate_heldout(model, *data.tokenizer, c, world, layout.dp_rank(), layout.dp());
  for (auto& unit : units) unit.reshard();
  if (world.rank() != 0) return score.accuracy();
  char line[160];
  std::snprintf(line, sizeof(line), "held-out accuracy %s training: %lld/%lld (%.1f%%)\n", when, static_cast<long long>(score.correct),
                static_cast<long long>(score.total), 100.0 * score.accuracy());
  log << line;
  for (size_t i = 0; std::string(when) == "after" && i < std::min<size_t>(3, score.answers.size()); ++i) {
    const HeldoutExample& e = score.answers[i];
    log << "  " << e.prompt << " -> " << e.answer << (e.answer == e.expected ? "  (right)" : "  (expected " + e.expected + ")") << "\n";
  }
  log << std::flush;
  return score.accuracy();
}

// The model as a Hugging Face folder in output_dir, like transformers' Trainer at the end.
void export_model(models::CausalLM& model, const TrainConfig& c, const data::Tokenizer& tokenizer, bool leader,
                  PipelineTraining* pipeline) {
  if (pipeline) {
    const auto full = pipeline->gather_parameters();  // the stages' parameters, on rank 0
    if (leader) models::save_pretrained(model.config(), full, c.output_dir);
  } else {
    models::save_pretrained(model, c.output_dir);
  }
  if (!leader) return;
  data::copy_tokenizer_files(tokenizer_dir(c), c.output_dir);
  if (!c.chat_template.empty()) add_missing_chat_template(c.output_dir, chat_template_for(c, tokenizer));
  write_generation_config(c.output_dir, models::is_debug_flavour(c.model_name_or_path) ? "" : c.model_name_or_path, tokenizer);
}

// The job's matmul roofline: every rank measures at once (so shared cores are shared here
// too), the rates summed.
double job_roofline_gflops(const models::ModelConfig& config, comm::Communicator& world) {
  at::Tensor rate = at::full({1}, measure_matmul_gflops(config), at::kDouble);
  world.all_reduce(rate).wait();
  return rate.item<double>();
}

// LlamaFactory's LogCallback progress fields of a trainer_log line.
nlohmann::json progress_fields(int64_t steps_done, int64_t total_steps) {
  return {{"current_steps", steps_done},
          {"total_steps", total_steps},
          {"percentage", std::round(10000.0 * static_cast<double>(steps_done) / static_cast<double>(total_steps)) / 100.0}};
}

double peak_rss_mib() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// VmRSS now (not the high-water mark): whether memory stays flat over a run shows in this.
double resident_mib() {
  std::ifstream statm("/proc/self/statm");
  long long pages = 0, resident = 0;
  if (!(statm >> pages >> resident)) return 0;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

// The checkpoint's facts, checked against this run: the sampler position only means the same
// data order with the same rows, global batch and seed.
CheckpointInfo resume_checkpoint(const std::string& dir, const TrainConfig& c, const data::GlobalBatchSampler& sampler,
                                 int64_t data_rows, int64_t total_steps) {
  const CheckpointInfo info = read_checkpoint_info(dir);
  const std::string head = "resume_from_checkpoint: " + dir + " was trained with ";
  if (info.global_batch_rows != sampler.global_batch()) {
    throw UserError(head + "a global batch of " + std::to_string(info.global_batch_rows) + " rows, this run has " +
                    std::to_string(sampler.global_batch()) +
                    " (per_device_train_batch_size x gradient_accumulation_steps x data-parallel ranks); keep it at " +
                    std::to_string(info.global_batch_rows));
  }
  if (info.data_rows != data_rows) {
    throw UserError(head + std::to_string(info.data_rows) + " data rows, this run has " + std::to_string(data_rows) +
                    "; use the same dataset, max_samples, cutoff_len and packing");
  }
  if (info.seed != c.seed) throw UserError(head + "seed " + std::to_string(info.seed) + "; set seed: " + std::to_string(info.seed));
  if (info.step >= total_steps) {
    throw UserError(head + std::to_string(info.step) + " steps already, and this run ends at step " + std::to_string(total_steps) +
                    "; raise max_steps (or num_train_epochs) to train further");
  }
  return info;
}

// `bf16: auto` becomes bf16 compute only when every rank's CPU has fast bf16 matmul (one
// rank without it would slow the whole job, and all ranks must agree on the dtype).
// global_batch_size as gradient accumulation: rows per step over rows per micro-batch of all
// data-parallel ranks (world / (tp x cp x pp)).
void resolve_global_batch(TrainConfig& c, int64_t world_size) {
  if (!c.global_batch_size) return;
  const AcceleratorConfig& a = c.accelerator;
  const int64_t parallel = a.tp_size * a.cp_size * a.pp_size;
  const int64_t dp = world_size % parallel == 0 ? world_size / parallel : 0;
  const int64_t per_step = c.per_device_train_batch_size * dp;
  if (dp == 0 || *c.global_batch_size % per_step != 0) {
    throw UserError("global_batch_size " + std::to_string(*c.global_batch_size) + " is not a multiple of micro_batch_size " +
                    std::to_string(c.per_device_train_batch_size) + " x " + std::to_string(dp) + " data-parallel ranks (world " +
                    std::to_string(world_size) + " / tp_size x cp_size x pp_size " + std::to_string(parallel) + ")");
  }
  const int64_t accumulation = *c.global_batch_size / per_step;
  if (c.gradient_accumulation_steps != 1 && c.gradient_accumulation_steps != accumulation) {
    throw UserError("global_batch_size " + std::to_string(*c.global_batch_size) + " means gradient_accumulation_steps " +
                    std::to_string(accumulation) + " here, but it is set to " + std::to_string(c.gradient_accumulation_steps) +
                    "; give one of them");
  }
  c.gradient_accumulation_steps = accumulation;
}

// bf16 compute (bf16, or bf16 parameters in fsdp_config.mix_precision) needs a bf16 matmul
// that accumulates in fp32 on every rank (platform/bf16_matmul.h). Elsewhere the run computes
// in fp32 and says so: LlamaFactory's configs ask for bf16 as a speed hint, and wrong numbers
// or a refusal would both be worse.
void keep_bf16_where_accurate(TrainConfig& c, comm::Communicator& world, std::ostream& log) {
  std::string& param_dtype = c.fsdp_config.mix_precision.param_dtype;
  if (!c.bf16 && param_dtype != "bfloat16") return;
  const bool mine = platform::bf16_matmul_accumulates_in_fp32();
  at::Tensor accurate = at::full({1}, mine ? 1 : 0, at::kLong);
  world.all_reduce(accurate, comm::ReduceOp::kMin).wait();
  if (accurate.item<int64_t>() == 1) return;
  if (world.rank() == 0) {
    log << (c.bf16 ? "bf16: true" : "fsdp_config.mix_precision.param_dtype: bfloat16") << " -> fp32 compute (LibTorch's bf16 matmul on "
        << (mine ? "a rank's" : "this") << " CPU, without AVX-512, accumulates in bfloat16: 1024 ones sum to 256)\n";
  }
  c.bf16 = false;
  param_dtype = "float32";
}

TrainConfig resolve_auto_choices(const TrainConfig& requested, comm::Communicator& world, std::ostream& log) {
  TrainConfig c = requested;
  resolve_global_batch(c, world.size());
  if (!c.bf16_auto) {
    keep_bf16_where_accurate(c, world, log);
    return c;
  }
  const platform::CpuFeatures cpu = platform::cpu_features();
  at::Tensor everyone = at::full({1}, cpu.fast_bf16() ? 1 : 0, at::kLong);
  world.all_reduce(everyone, comm::ReduceOp::kMin).wait();
  c.bf16 = everyone.item<int64_t>() == 1;
  if (world.rank() == 0) {
    log << "bf16: auto -> " << (c.bf16 ? "bf16 compute (every rank's CPU has AVX512_BF16 or AMX-BF16)"
                                       : "fp32 compute (" + std::string(cpu.fast_bf16() ? "a rank's" : "this") +
                                             " CPU has neither AVX512_BF16 nor AMX-BF16, where bf16 matmul is slower than fp32)")
        << "\n";
  }
  keep_bf16_where_accurate(c, world, log);
  return c;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

TrainResult run_training(const TrainConfig& requested, std::shared_ptr<comm::Communicator> world, std::ostream& log,
                         bool progress_bar) {
  const bool leader = world->rank() == 0;
  const TrainConfig c = resolve_auto_choices(requested, *world, log);
  check_heldout_config(c);
  const auto output_lock = prepare_output_dir(c, *world);
  TrainData data = prepare_train_data(c);

  const ParallelLayout layout = build_layout(c, world);
  const mesh::DeviceMesh& mesh = layout.mesh;
  const int64_t dp = layout.dp(), dp_rank = layout.dp_rank(), tp = layout.tp();

  models::ModelLoadOptions load;
  load.seed = static_cast<uint64_t>(c.seed);
  load.plan_overrides = c.plan_overrides;
  load.num_hidden_layers = c.num_hidden_layers;
  const bool from_folder = !models::is_debug_flavour(c.model_name_or_path);
  load.deferred_init = from_folder;
  auto model = models::AutoModelForCausalLM::from_pretrained(c.model_name_or_path, load);
  std::optional<PipelinePlan> pipeline_plan;  // each rank keeps its stages before loading or sharding anything
  if (layout.dims.pp > 1) {
    pipeline_plan = plan_pipeline(c, model->config());
    pp::keep_stages(*model, pipeline_plan->split, layout.mesh.local_rank("pp"), layout.dims.pp);
  }
  const int64_t vocab = model->config().vocab_size;
  for (const data::TokenRows* rows : {&data.rows, &data.eval_rows}) {
    const int64_t top = rows->max_id();
    if (top >= vocab) {
      throw UserError("the tokenizer produced id " + std::to_string(top) + " but the model's vocab_size is " + std::to_string(vocab) +
                      "; use the model's own tokenizer (tokenizer: ...)");
    }
  }
  ParallelModel parallel = parallelize(*model, layout, c);
  std::vector<fsdp::FSDPModule>& units = parallel.units;
  fsdp::FSDPModule root = units.back();
  root.set_reduce_op_type("sum");  // each micro-batch loss is already divided by the global token count
  root.set_reshard_after_backward(c.fsdp_config.reshard_after_backward);
  if (from_folder) models::load_pretrained_weights(*model, c.model_name_or_path, c.num_hidden_layers.has_value());
  std::unique_ptr<PipelineTraining> pipeline;
  if (pipeline_plan) pipeline = std::make_unique<PipelineTraining>(*model, *pipeline_plan, layout, root, world, c);
  if (!c.do_train) {  // load, evaluate, export
    TrainResult result;
    if (c.heldout_eval_samples > 0) result.heldout_accuracy_after = evaluate_and_report("without", *model, data, c, layout, *world, units, log);
    export_model(*model, c, *data.tokenizer, leader, pipeline.get());
    if (leader) log << "do_train is false: exported the model to " << c.output_dir << " without training\n";
    return result;
  }
  auto optimizer = make_optimizer(c, *model, world);
  if (!c.optimizer_offload_dir.empty()) {
    // Under mixed precision the fp32 master shards join the moments in the file.
    const std::vector<int64_t> masters = fsdp::separate_master_numels(*model);
    optimizer->offload_state(c.optimizer_offload_dir, masters);
    optim::OptimizerStateFile* file = optimizer->state_file();
    fsdp::place_master_shards(*model, {[&](size_t k, int64_t) { return optimizer->extra_tensor(k); },
                                       [file](const at::Tensor& shard) { file->release(shard); }});
  }
  const int64_t accum = pipeline ? pipeline_microbatches(c) : c.gradient_accumulation_steps, per_device = c.per_device_train_batch_size;
  StepSetup step_setup{*model, root, *optimizer, *world, data, model->parameters(), {}, accum, dp, dp_rank, tp, c.max_grad_norm};
  step_setup.norm_weights = pipeline ? pipeline->norm_weights(world->size()) : fsdp::gradient_norm_weights(*model, world->size());
  step_setup.pipeline = pipeline.get();
  step_setup.global_aux_loss = c.moe_aux_loss_scope == "global";
  step_setup.base_lr = c.learning_rate;
  for (const auto& group : optimizer->param_groups()) {
    step_setup.group_lr.push_back(static_cast<const torch::optim::AdamWOptions&>(group.options()).lr());
  }
  step_setup.cp = layout.cp();
  step_setup.cp_rank = layout.cp_rank();
  const bool moe = model->config().num_experts > 0;

  const data::GlobalBatchSampler sampler(static_cast<int64_t>(data.rows.size()), per_device * accum * dp,
                                         static_cast<uint64_t>(c.seed));
  const int64_t total_steps = c.max_steps > 0 ? c.max_steps
                                              : static_cast<int64_t>(std::ceil(c.num_train_epochs * static_cast<double>(sampler.steps_per_epoch())));
  const LrSchedule schedule = lr_schedule_for(c, total_steps);

  data::SamplerPosition position;
  int64_t start_step = 0, tokens_before = 0, total_tokens = 0;  // tokens: before this run, in it
  std::string resumed_from;
  std::vector<std::string> superseded;  // later checkpoints of the run this one branches from
  if (!c.resume_from_checkpoint.empty()) {
    resumed_from = resolve_checkpoint(c.resume_from_checkpoint, c.output_dir);
    const CheckpointInfo info = resume_checkpoint(resumed_from, c, sampler, static_cast<int64_t>(data.rows.size()), total_steps);
    load_checkpoint(resumed_from, *model, optimizer.get(), world->rank());
    start_step = info.step;
    tokens_before = info.input_tokens;
    position = sampler.position_from_json(info.sampler_position.dump());
    if (leader) superseded = supersede_later_checkpoints(c.output_dir, start_step);
    world->barrier().wait();  // no rank saves before the old line is out of the way
  }
  ProgressDisplay screen(log, leader && progress_bar, total_steps);
  const auto save = [&](int64_t steps_done) {
    if (leader) screen.line("saving checkpoint-" + std::to_string(steps_done));
    CheckpointInfo info;
    info.step = steps_done;
    info.sampler_position = nlohmann::json::parse(sampler.position_json(position));
    info.global_batch_rows = sampler.global_batch();
    info.data_rows = static_cast<int64_t>(data.rows.size());
    info.seed = c.seed;
    info.world_size = world->size();
    info.mesh_shape = mesh.shape();
    info.model = c.model_name_or_path;
    info.input_tokens = tokens_before + total_tokens;
    const std::string dir = save_checkpoint(c.output_dir, info, {models::model_config_json(model->config()), tokenizer_dir(c)},
                                            *model, *optimizer, *world, c.save_total_limit.value_or(0));
    if (leader) screen.line("saved " + dir);
  };

  std::unique_ptr<TrainerLog> trainer_log;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  if (leader) {
    trainer_log = std::make_unique<TrainerLog>(c.output_dir, start_step);
    const bool wants_tensorboard = std::any_of(c.report_to.begin(), c.report_to.end(), [](const std::string& t) { return t == "tensorboard" || t == "all"; });
    if (wants_tensorboard) tensorboard = std::make_unique<TensorBoardWriter>(c.logging_dir.empty() ? default_tensorboard_dir(c.output_dir) : c.logging_dir);
    log << "hyperparallel train: " << world->size() << " ranks, " << mesh.to_string() << ", " << model->config().parameter_count()
        << " parameters, " << data.conversations << (c.stage == "pt" ? " texts -> " : " conversations -> ") << data.rows.size() << " rows"
        << (c.packing ? " (packed)" : "") << (data.eval_rows.empty() ? "" : ", " + std::to_string(data.eval_rows.size()) + " eval rows") << ", " << sampler.steps_per_epoch() << " steps per epoch, " << total_steps << " steps\n";
    if (!c.ignored_keys.empty()) {
      log << "ignored (no effect here; docs/config.md):\n";
      for (const auto& [key, why] : c.ignored_keys) log << "  " << key << ": " << why << "\n";
    }
    for (const auto& note : data.notes) log << note << "\n";
    if (layout.expert_mesh) {
      log << "experts: " << layout.expert_mesh->to_string() << ", " << model->config().num_experts / layout.dims.ep
          << " experts per rank in each MoE layer\n";
    }
    if (pipeline) {
      const pp::PipelineSchedule& ps = pipeline->plan().schedule;
      log << "pipeline: " << ps.ranks << " ranks x " << ps.virtual_stages << " stages each, layers " << pp::to_string(pipeline->plan().split)
          << ", " << ps.name << " over " << ps.microbatches << " micro-batches of " << per_device << " rows\n";
    }
    if (layout.cp() > 1) {
      const cp::ContextParallelOptions o{c.accelerator.cp_algorithm, c.accelerator.ulysses_degree, tp};
      const int64_t degree = cp::resolved_ulysses_degree(o, layout.cp());
      log << "context parallelism: " << layout.cp() << " ranks per row (zigzag chunks), " << c.accelerator.cp_algorithm
          << (degree > 1 && degree < layout.cp() ? ", Ulysses groups of " + std::to_string(degree) : "")
          << ", FSDP over " << layout.dp_mesh.to_string() << "\n";
    }
    if (const std::string ac = activation_checkpoint_mode(c); ac != "off") {
      const int64_t every = c.activation_checkpoint.every;
      log << "activation checkpointing: " << ac << (ac == "selective" ? " (" + c.activation_checkpoint.selective_policy + ")" : "")
          << (every > 1 ? ", every " + std::to_string(every) + " layers" : "")
          << (c.activation_checkpoint.swap_inputs ? ", kept inputs swapped to a host pool" : "") << "\n";
    }
    if (const LossChunking chunking = resolve_loss_chunking(c, model->config(), layout.cp()); chunking.announce) {
      log << "chunked loss: " << (chunking.chunk_tokens > 0 ? std::to_string(chunking.chunk_tokens) + " tokens per chunk (" + chunking.reason + ")"
                                                            : chunking.reason)
          << "\n";
    }
    if (const auto* file = optimizer->state_file()) {
      log << "optimizer offload: " << (file->bytes() >> 20) << " MiB of AdamW moments"
          << (fsdp::separate_master_numels(*model).empty() ? "" : " and fp32 master shards") << " per rank in a file in "
          << c.optimizer_offload_dir << "\n";
    }
    if (c.validate_placement) {
      log << (tp > 1 ? "model.validate_placement: Validation mode, every module boundary of the tensor-parallel plan is checked\n"
                     : "model.validate_placement: no tp axis (tp_size 1), so no placement to check\n");
    }
    if (!resumed_from.empty()) log << "resumed from " << resumed_from << " at step " << start_step << "\n";
    for (const auto& dir : superseded) {
      log << "kept " << dir << ": a checkpoint of the run that went on past step " << start_step
          << "; it is not 'latest' and this run does not touch it\n";
    }
    for (const auto& s : data.load_report.skipped) log << "skipped: " << s << "\n";
    for (const auto& s : data.sample_report.dropped) log << "dropped: " << s << "\n";
    if (data.sample_report.truncated) log << data.sample_report.truncated << " samples cut at cutoff_len " << c.cutoff_len << "\n";
  }

  // Every communicator the step uses, once each (a 1-D mesh's axis group is the mesh's group).
  std::vector<std::shared_ptr<comm::Communicator>> comms;
  for (auto cm : {world, mesh.comm()}) {
    if (std::find(comms.begin(), comms.end(), cm) == comms.end()) comms.push_back(cm);
  }
  for (const auto* m : {&mesh, &layout.dp_mesh}) {  // FSDP's mesh folds cp into its shard axis
    for (const auto& axis : m->axis_names()) {
      if (std::find(comms.begin(), comms.end(), m->comm(axis)) == comms.end()) comms.push_back(m->comm(axis));
    }
  }
  const auto counters_now = [&] {
    std::vector<comm::CommCounters> v;
    for (const auto& cm : comms) v.push_back(cm->counters());
    return v;
  };
  const auto wait_now = [&] {
    double s = 0;
    for (const auto& cm : comms) s += cm->wait_seconds();
    return s;
  };
  const auto counters_start = counters_now();
  StepTrace step_trace(c.trace_steps, total_steps, units, comms);

  const double roofline_gflops = job_roofline_gflops(model->config(), *world);
  const double flops_per_token = training_flops_per_token(
      model->config(), static_cast<double>(data.rows.total_tokens()) / static_cast<double>(std::max<int64_t>(1, data.rows.size())));

  TrainResult result;
  // The eval loss (eval_loss.h): logged as its own trainer_log line, HF's log_history entry
  // and TensorBoard's eval/loss.
  const EvalShare eval_share{c.per_device_eval_batch_size, dp, dp_rank, tp, layout.cp(), layout.cp_rank()};
  const auto run_eval = [&](int64_t steps_done) {
    const auto t = Clock::now();
    const double eval_loss = evaluate_loss(*model, data.eval_rows, data.pad_id, eval_share, *world, units, pipeline.get());
    const double seconds = std::max(1e-9, std::chrono::duration<double>(Clock::now() - t).count());
    result.eval_losses.emplace_back(steps_done, eval_loss);
    if (!leader) return;
    const double epoch = static_cast<double>(steps_done) / static_cast<double>(sampler.steps_per_epoch());
    const double rows = static_cast<double>(data.eval_rows.size());
    nlohmann::json record{{"step", steps_done}, {"eval_loss", eval_loss}, {"epoch", epoch}, {"eval_runtime", seconds},
                          {"eval_samples_per_second", rows / seconds}};
    record.update(progress_fields(steps_done, total_steps));
    trainer_log->write(record);
    if (tensorboard) {
      tensorboard->scalar("eval/loss", eval_loss, steps_done);
      tensorboard->flush();
    }
    char line[128];
    std::snprintf(line, sizeof(line), "step %lld/%lld eval_loss %.4f (%zu rows, %.1fs)", static_cast<long long>(steps_done),
                  static_cast<long long>(total_steps), eval_loss, data.eval_rows.size(), seconds);
    screen.line(line);
  };
  const auto eval_due = [&](int64_t steps_done) {
    if (c.eval_strategy == "steps") return steps_done % resolve_eval_steps(c, total_steps) == 0;
    if (c.eval_strategy == "epoch") return steps_done % sampler.steps_per_epoch() == 0;
    return false;
  };
  if (c.eval_on_start && !data.eval_rows.empty()) run_eval(start_step);
  if (c.heldout_eval_samples > 0) result.heldout_accuracy_before = evaluate_and_report("before", *model, data, c, layout, *world, units, log);
  std::vector<double> step_times;
  std::vector<std::pair<int64_t, double>> logged = leader ? trainer_log->kept() : std::vector<std::pair<int64_t, double>>{};
  double interval_loss = 0, interval_tokens_per_s = 0;
  int64_t interval_steps = 0;
  double interval_aux = 0, interval_dropped = 0;  // MoE
  const auto t_start = Clock::now();
  double step_waits = 0;  // time blocked in collectives during the steps, not in eval or checkpoints
  for (int64_t step = start_step; step < total_steps; ++step) {
    step_trace.step_starting(step);
    const auto t_step = Clock::now();
    const double wait_before = wait_now();
    const double lr = schedule.lr_at(step);
    const StepOutcome done = run_optimizer_step(step_setup, sampler.global_batch_rows(position), lr);
    step_waits += wait_now() - wait_before;
    step_trace.step_done(step, t_step);
    const double step_loss = done.loss, grad_norm = done.grad_norm;
    interval_aux += done.aux_loss;
    interval_dropped += done.dropped_fraction;
    const int64_t input_tokens = done.input_tokens;
    position = sampler.next(position);

    const double seconds = std::chrono::duration<double>(Clock::now() - t_step).count();
    step_times.push_back(seconds);
    total_tokens += input_tokens;
    result.step_losses.push_back(step_loss);
    result.grad_norms.push_back(grad_norm);
    interval_loss += step_loss;
    interval_tokens_per_s += static_cast<double>(input_tokens) / seconds;
    ++interval_steps;
    const bool last = step + 1 == total_steps;
    const double elapsed = std::chrono::duration<double>(Clock::now() - t_start).count();
    const double eta = elapsed / static_cast<double>(step + 1 - start_step) * static_cast<double>(total_steps - step - 1);
    screen.update(step + 1, step_loss, lr, static_cast<double>(input_tokens) / seconds, eta);
    if (leader && ((step + 1) % c.logging_steps == 0 || last)) {
      const double epoch = static_cast<double>(step + 1) / static_cast<double>(sampler.steps_per_epoch());
      const double mean_loss = interval_loss / static_cast<double>(interval_steps);
      const double tokens_per_s = interval_tokens_per_s / static_cast<double>(interval_steps);
      const double throughput = static_cast<double>(total_tokens) / elapsed;
      // Ours first, then LlamaFactory's LogCallback fields, so its tools read the file too.
      nlohmann::json moe_fields = nlohmann::json::object();
      if (moe) {  // the total loss is HF's: lm_loss + router_aux_loss_coef x aux_loss
        const double mean_aux = interval_aux / static_cast<double>(interval_steps);
        moe_fields = {{"aux_loss", mean_aux}, {"lm_loss", mean_loss - model->config().router_aux_loss_coef * mean_aux}};
        if (c.moe_capacity_factor > 0) moe_fields["moe_dropped_fraction"] = interval_dropped / static_cast<double>(interval_steps);
      }
      interval_aux = interval_dropped = 0;
      nlohmann::json record{{"step", step + 1}, {"loss", mean_loss}, {"grad_norm", grad_norm}, {"lr", lr}, {"epoch", epoch},
                          {"tokens_per_s", tokens_per_s}, {"elapsed_s", elapsed}, {"peak_rss_mib", peak_rss_mib()}, {"rss_mib", resident_mib()},
                          {"mfu", flops_per_token * throughput / (roofline_gflops * 1e9)},
                          {"elapsed_time", timedelta_text(elapsed)}, {"remaining_time", timedelta_text(eta)},
                          {"throughput", std::round(throughput * 100.0) / 100.0}, {"total_tokens", tokens_before + total_tokens}};
      record.update(progress_fields(step + 1, total_steps));
      record.update(moe_fields);
      trainer_log->write(record);
      logged.emplace_back(step + 1, mean_loss);
      if (tensorboard) {  // HF's TensorBoardCallback tags
        for (const auto& [tag, value] : {std::pair<const char*, double>{"train/loss", mean_loss}, {"train/grad_norm", grad_norm},
                                         {"train/learning_rate", lr}, {"train/epoch", epoch}, {"train/tokens_per_s", tokens_per_s}}) {
          tensorboard->scalar(tag, value, step + 1);
        }
        tensorboard->flush();
      }
      char line[256];
      std::snprintf(line, sizeof(line), "step %lld/%lld loss %.4f grad_norm %.3f lr %.3g epoch %.2f tok/s %.0f eta %.0fs",
                    static_cast<long long>(step + 1), static_cast<long long>(total_steps), mean_loss, grad_norm, lr, epoch,
                    tokens_per_s, eta);
      screen.line(line);
      interval_loss = interval_tokens_per_s = 0;
      interval_steps = 0;
    }
    if (eval_due(step + 1) || (last && c.do_eval)) run_eval(step + 1);
    if (c.save_checkpoints && ((c.save_steps > 0 && (step + 1) % c.save_steps == 0) || last)) save(step + 1);
  }
  screen.finish();
  step_trace.write(*world, c.output_dir);
  result.steps = total_steps;
  result.first_step = start_step;
  export_model(*model, c, *data.tokenizer, leader, pipeline.get());
  const double train_seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (c.heldout_eval_samples > 0) result.heldout_accuracy_after = evaluate_and_report("after", *model, data, c, layout, *world, units, log);

  // Summary: per-rank peak RSS gathered to everyone; communication per step on this rank.
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  at::Tensor rss = at::zeros({world->size()}, at::kLong);
  at::Tensor mine = at::full({1}, static_cast<int64_t>(usage.ru_maxrss) * 1024, at::kLong);
  world->all_gather(rss, mine).wait();
  const auto counters_end = counters_now();
  nlohmann::json comm_per_step = nlohmann::json::object();
  for (int k = 0; k < comm::kNumCollectiveKinds; ++k) {
    const auto kind = static_cast<comm::CollectiveKind>(k);
    int64_t calls = 0, bytes = 0;
    for (size_t i = 0; i < comms.size(); ++i) {
      const auto d = counters_end[i] - counters_start[i];
      calls += d[kind].calls;
      bytes += d[kind].bytes;
    }
    if (calls == 0) continue;
    comm_per_step[comm::to_string(kind)] = {{"calls", static_cast<double>(calls) / static_cast<double>(total_steps)},
                                            {"bytes", static_cast<double>(bytes) / static_cast<double>(total_steps)}};
  }
  if (leader) {
    nlohmann::json summary = {
        {"world_size", world->size()},
        {"mesh", {{"shape", mesh.shape()}, {"axis_names", mesh.axis_names()}}},
        {"steps", total_steps},
        {"final_loss", result.step_losses.empty() ? 0.0 : result.step_losses.back()},
        {"step_time_s_median", median(step_times)},
        {"tokens_per_s", static_cast<double>(total_tokens) / train_seconds},
        {"peak_rss_bytes", std::vector<int64_t>(rss.data_ptr<int64_t>(), rss.data_ptr<int64_t>() + rss.numel())},
        {"comm_per_step_rank0", comm_per_step},
        {"exposed_comm_fraction", step_waits / std::max(1e-9, std::accumulate(step_times.begin(), step_times.end(), 0.0))},
        {"flops_per_token", flops_per_token},
        {"roofline_gflops", roofline_gflops},
        {"mfu", flops_per_token * static_cast<double>(total_tokens) / train_seconds / (roofline_gflops * 1e9)}};
    if (c.activation_checkpoint.swap_inputs) {
      const models::ActivationSwapTraffic swapped = models::activation_swap_traffic(*model);
      summary["activation_swap_rank0"] = {{"bytes_out", swapped.bytes_out}, {"bytes_in", swapped.bytes_in},
                                          {"stashed", swapped.stashed}, {"prefetched", swapped.prefetched}};
    }
    if (result.heldout_accuracy_before) summary["heldout_accuracy_before"] = *result.heldout_accuracy_before;
    if (result.heldout_accuracy_after) summary["heldout_accuracy_after"] = *result.heldout_accuracy_after;
    write_json_file(c.output_dir + "/train_summary.json", summary);
    TrainMetrics metrics;
    metrics.global_step = total_steps;
    metrics.max_steps = total_steps;
    metrics.epoch = static_cast<double>(total_steps) / static_cast<double>(sampler.steps_per_epoch());
    for (double loss : result.step_losses) metrics.train_loss += loss / static_cast<double>(result.step_losses.size());
    metrics.train_runtime_s = train_seconds;
    metrics.samples = (total_steps - start_step) * sampler.global_batch();
    metrics.input_tokens = tokens_before + total_tokens;
    metrics.total_flos = 6.0 * static_cast<double>(model->config().parameter_count()) * static_cast<double>(metrics.input_tokens);
    metrics.global_batch_rows = sampler.global_batch();
    metrics.perplexity = c.stage == "pt";
    if (!result.eval_losses.empty() && result.eval_losses.back().first == total_steps) metrics.eval_loss = result.eval_losses.back().second;
    write_hf_trainer_files(c.output_dir, c, trainer_log->lines(), metrics);
    if (tensorboard) {
      tensorboard->scalar("train/train_runtime", metrics.train_runtime_s, total_steps);
      tensorboard->scalar("train/train_loss", metrics.train_loss, total_steps);
      tensorboard->scalar("train/total_flos", metrics.total_flos, total_steps);
      tensorboard->flush();
      log << "TensorBoard: " << tensorboard->path() << "\n";
    }
    if (c.plot_loss) {
      write_loss_svg(c.output_dir + "/training_loss.svg", logged);
      convert_svg_to_png(c.output_dir + "/training_loss.svg", c.output_dir + "/training_loss.png");
    }
  }
  return result;
}

}  // namespace hyperparallel::train
