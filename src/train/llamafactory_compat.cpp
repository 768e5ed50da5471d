// LlamaFactory / HF Trainer keys that are not ours. See llamafactory_compat.h.
#include "llamafactory_compat.h"

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "hyperparallel/io/user_files.h"
#include "hyperparallel/platform/suggest.h"
#include "hyperparallel/platform/user_error.h"

namespace hyperparallel::train::compat {
namespace {

// Reasons shared by many keys.
constexpr const char* kLocalModels = "models and tokenizers are read from local folders; nothing is downloaded";
constexpr const char* kNoPrediction = "generation settings of predict/chat; training does not generate";
constexpr const char* kNoTrackers = "no experiment tracker is contacted; the metrics are in trainer_log.jsonl";
constexpr const char* kNoAdapters = "applies with finetuning_type lora/oft/freeze, which are not supported (finetuning_type: full is)";
constexpr const char* kOtherStages = "applies to the dpo/kto/ppo/rm stages; only sft and pt run here";
constexpr const char* kTextOnly = "multimodal input; the supported models are text-only";
constexpr const char* kCudaOnly = "a CUDA/NPU kernel or runtime setting; this build computes on the CPU";
constexpr const char* kLoader = "data loading here is in-process and deterministic; there are no loader workers";
constexpr const char* kNoEval = "settings of HF's evaluation loop and metrics; the evaluation here reports eval_loss (train/eval_loss.h)";
constexpr const char* kCheckpointing =
    "activation checkpointing here is always the reentrant recompute of whole decoder layers (activation_checkpoint.*, docs/memory.md)";
constexpr const char* kHub = "nothing is uploaded; the exported model is a local folder";

std::vector<ForeignKey> build_table() {
  std::vector<ForeignKey> t;
  const auto ignored = [&t](std::initializer_list<const char*> keys, const std::string& why) {
    for (const char* k : keys) t.push_back({k, Disposition::kIgnored, why});
  };
  const auto refused = [&t](std::initializer_list<const char*> keys, const std::string& what) {
    for (const char* k : keys) t.push_back({k, Disposition::kRefusedWhenOn, what});
  };
  // --- model arguments ---------------------------------------------------------------
  ignored({"cache_dir", "model_revision", "hf_hub_token", "ms_hub_token", "om_hub_token", "use_fast_tokenizer"}, kLocalModels);
  ignored({"flash_attn", "use_v1_kernels", "enable_liger_kernel", "use_liger_kernel", "use_kernels"},
          "attention and fused kernels here are this library's own CPU kernels, always on (docs/models.md)");
  refused({"disable_shuffling"}, "rows are always shuffled per epoch (seed decides the order); remove the key");
  ignored({"gradient_checkpointing_kwargs", "use_reentrant_gc", "use_unsloth_gc"}, kCheckpointing);
  ignored({"low_cpu_mem_usage", "offload_folder", "device_map", "compute_dtype", "infer_dtype", "model_max_length",
           "block_diag_attn", "print_param_status", "use_kv_cache"},
          "set internally by LlamaFactory or used only at inference; no effect on training here");
  ignored({"upcast_layernorm", "upcast_lmhead_output"}, "parameters are kept in float32 (bf16 compute keeps float32 masters)");
  ignored({"infer_backend", "vllm_maxlen", "vllm_gpu_util", "vllm_enforce_eager", "vllm_max_lora_rank", "vllm_config",
           "sglang_maxlen", "sglang_mem_fraction", "sglang_tp_size", "sglang_config", "sglang_lora_backend"},
          "inference engine settings of llamafactory-cli chat/api; hyperparallel generate is the inference here");
  ignored({"export_dir", "export_size", "export_device", "export_quantization_bit", "export_quantization_dataset",
           "export_quantization_nsamples", "export_quantization_maxlen", "export_legacy_format", "export_hub_model_id"},
          "settings of llamafactory-cli export; training exports output_dir/model, and hyperparallel export converts any checkpoint");
  ignored({"image_max_pixels", "image_min_pixels", "image_do_pan_and_scan", "crop_to_patches", "video_max_pixels",
           "video_min_pixels", "video_fps", "video_maxlen", "use_audio_in_video", "audio_sampling_rate", "media_dir",
           "freeze_vision_tower", "freeze_multi_modal_projector"},
          kTextOnly);
  ignored({"kt_cpu_activation", "kt_weight_path", "kt_non_expert_weight_path", "kt_expert_checkpoint_path", "kt_use_lora_experts",
           "kt_lora_expert_num", "kt_lora_expert_intermediate_size", "kt_config"},
          "KTransformers settings; use_kt is refused");
  refused({"adapter_name_or_path", "adapter_folder"}, "adapters are not supported; merge the adapter into the model first (llamafactory-cli export) and point model_name_or_path at it");
  refused({"quantization_bit", "quantization_method", "quantization_type", "double_quantization", "quantization_device_map"},
          "quantized training is not supported; train the full-precision model (bf16: true halves the compute memory)");
  refused({"resize_vocab", "add_tokens", "add_special_tokens", "new_special_tokens_config", "init_special_tokens"},
          "the vocabulary is the tokenizer's; add tokens to tokenizer.json and resize the embeddings before training");
  refused({"split_special_tokens"}, "special tokens are always matched whole; remove the key");
  refused({"rope_scaling"}, "set rope_scaling in the model's config.json; it is read from there");
  refused({"shift_attn", "mixture_of_depths", "use_unsloth", "train_from_scratch", "use_kt", "freeze_language_model"},
          "not supported by this trainer; remove the key");
  refused({"moe_aux_loss_coef"}, "set router_aux_loss_coef in the model's config.json; it is read from there");
  // --- data arguments ----------------------------------------------------------------
  ignored({"preprocessing_batch_size", "data_shared_file_system", "ignore_pad_token_for_loss", "eval_num_beams",
           "eval_on_each_dataset", "buffer_size", "interleave_probs"},
          "no effect here: datasets are read whole and tokenized in threads (preprocessing_num_workers), padding never takes a loss");
  refused({"streaming"}, "datasets are read whole; remove streaming (max_samples limits how much is read)");
  // --- finetuning arguments ----------------------------------------------------------
  ignored({"lora_alpha", "lora_dropout", "lora_rank", "lora_target", "loraplus_lr_ratio", "loraplus_lr_embedding",
           "use_rslora", "use_dora", "pissa_init", "pissa_iter", "pissa_convert", "create_new_adapter", "additional_target",
           "module_dropout", "oft_rank", "oft_block_size", "oft_target", "freeze_trainable_layers", "freeze_trainable_modules",
           "freeze_extra_modules"},
          kNoAdapters);
  ignored({"pref_beta", "pref_ftx", "pref_bco_weight", "pref_loss", "dpo_label_smoothing", "kto_chosen_weight",
           "kto_rejected_weight", "simpo_gamma", "ppo_buffer_size", "ppo_epochs", "ppo_score_norm", "ppo_target",
           "ppo_whiten_rewards", "ref_model", "ref_model_adapters", "ref_model_quantization_bit", "reward_model",
           "reward_model_adapters", "reward_model_quantization_bit", "reward_model_type", "ld_alpha"},
          kOtherStages);
  ignored({"galore_target", "galore_rank", "galore_update_interval", "galore_scale", "galore_proj_type", "galore_layerwise",
           "apollo_target", "apollo_rank", "apollo_update_interval", "apollo_scale", "apollo_proj", "apollo_proj_type",
           "apollo_scale_type", "apollo_layerwise", "apollo_scale_front", "badam_mode", "badam_start_block",
           "badam_switch_mode", "badam_switch_interval", "badam_update_ratio", "badam_mask_mode", "badam_verbose",
           "asft_alpha", "eaft_alpha"},
          "settings of an optimizer or loss that is refused on its own (use_galore, use_apollo, use_badam, use_asft_loss, use_eaft_loss)");
  ignored({"use_swanlab", "swanlab_project", "swanlab_workspace", "swanlab_run_name", "swanlab_mode", "swanlab_api_key",
           "swanlab_logdir", "swanlab_lark_webhook_url", "swanlab_lark_secret", "run_name"},
          kNoTrackers);
  ignored({"compute_accuracy"}, "token accuracy of predictions; the evaluation here reports eval_loss");
  ignored({"include_effective_tokens_per_second", "include_tokens_per_second", "include_num_input_tokens_seen"},
          "tokens seen and tokens per second are always in trainer_log.jsonl");
  refused({"use_galore", "use_apollo", "use_badam", "use_adam_mini", "use_muon"},
          "only AdamW is implemented; remove the key (Muon is planned)");
  refused({"use_llama_pro", "use_mca", "use_megatron_bridge"}, "not supported by this trainer; remove the key");
  refused({"use_dft_loss", "use_asft_loss", "use_eaft_loss"}, "only the standard token cross-entropy is implemented; remove the key");
  refused({"pure_bf16"}, "float32 master weights are always kept; use bf16: true for bfloat16 compute");
  refused({"early_stopping_steps"}, "early stopping is not supported; set max_steps");
  // --- LlamaFactory's training arguments ---------------------------------------------
  ignored({"ray_num_workers", "ray_init_kwargs", "ray_run_name", "ray_storage_path", "ray_storage_filesystem", "resources_per_worker",
           "placement_strategy"},
          "Ray settings; ranks are started by hyperparallel train/run, torchrun, mpirun or Slurm");
  ignored({"enable_torch_profiler", "profiler_output_dir", "profiler_wait_steps", "profiler_warmup_steps",
           "profiler_active_steps", "profiler_repeat", "profiler_record_shapes", "profiler_profile_memory",
           "profiler_with_stack", "profile_modules"},
          "the PyTorch profiler is not available; HP_TRACE=FILE writes a Chrome trace (docs/reliability.md)");
  refused({"fp8", "fp8_backend", "fp8_enable_fsdp_float8_all_gather"}, "fp8 is not supported on CPU; use bf16: true");
  // --- Hugging Face TrainingArguments --------------------------------------------------
  ignored({"dataloader_num_workers", "dataloader_prefetch_factor", "dataloader_pin_memory", "dataloader_persistent_workers",
           "dataloader_drop_last", "remove_unused_columns", "length_column_name", "label_names", "past_index",
           "data_seed", "dispatch_batches", "split_batches"},
          kLoader);
  ignored({"log_level", "log_level_replica", "log_on_each_node", "logging_first_step", "logging_nan_inf_filter",
           "disable_tqdm", "skip_memory_metrics"},
          "console and logging settings; rank 0 prints progress and writes trainer_log.jsonl every logging_steps");
  ignored({"save_safetensors", "save_on_each_node", "restore_callback_states_from_checkpoint"},
          "checkpoints and exports are always safetensors, written once per job");
  ignored({"save_only_model"}, "checkpoints always hold the optimizer state, so every one can resume");
  ignored({"tf32", "half_precision_backend", "fp16_opt_level", "fp16_backend", "bf16_full_eval", "fp16_full_eval",
           "jit_mode_eval", "use_ipex", "torch_compile", "torch_compile_backend", "torch_compile_mode", "torchdynamo",
           "torch_empty_cache_steps", "no_cuda", "use_cpu", "use_mps_device", "tpu_num_cores", "tpu_metrics_debug", "debug",
           "local_rank", "ddp_backend", "mp_parameters", "accelerator_config", "ray_scope"},
          kCudaOnly);
  ignored({"ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "fsdp", "fsdp_min_num_params",
           "fsdp_transformer_layer_cls_to_wrap", "average_tokens_across_devices"},
          "sharding is this trainer's FSDP (fsdp_config; every rank by default), and the loss is always averaged over the "
          "global batch's label tokens");
  ignored({"eval_accumulation_steps", "eval_delay", "prediction_loss_only", "include_inputs_for_metrics", "include_for_metrics",
           "eval_do_concat_batches", "batch_eval_metrics", "eval_use_gather_object", "metric_for_best_model", "greater_is_better"},
          kNoEval);
  ignored({"hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push", "hub_revision",
           "push_to_hub_model_id", "push_to_hub_organization", "push_to_hub_token"},
          kHub);
  ignored({"full_determinism"}, "runs are deterministic already (same config and ranks, same numbers)");
  ignored({"optim_target_modules", "optim_args"}, "settings of optimizers other than AdamW, which are refused by optim");
  ignored({"generation_max_length", "generation_num_beams", "generation_config", "sortish_sampler", "do_sample",
           "temperature", "top_p", "top_k", "num_beams", "max_length", "max_new_tokens", "repetition_penalty",
           "length_penalty", "skip_special_tokens"},
          kNoPrediction);
  refused({"push_to_hub"}, kHub);
  refused({"do_predict", "predict_with_generate"}, "prediction is not part of train; answer prompts with hyperparallel generate --model OUTPUT_DIR/model");
  refused({"load_best_model_at_end"}, "the model after the last step is exported; set max_steps (or use an earlier checkpoint with hyperparallel export)");
  refused({"label_smoothing_factor"}, "label smoothing is not implemented; remove the key");
  refused({"group_by_length"}, "batches follow the shuffled order (packing: true fills rows instead); remove the key");
  refused({"auto_find_batch_size"}, "set per_device_train_batch_size; the batch size is never changed during a run");
  refused({"neftune_noise_alpha"}, "NEFTune embedding noise is not implemented; remove the key");
  refused({"adafactor"}, "only AdamW is implemented; remove the key");
  refused({"ignore_data_skip"}, "a resumed run always continues the data where the checkpoint stopped; remove the key");
  return t;
}

}  // namespace

const std::vector<ForeignKey>& foreign_keys() {
  static const std::vector<ForeignKey> table = build_table();
  return table;
}

const ForeignKey* find_foreign_key(const std::string& key) {
  for (const ForeignKey& k : foreign_keys()) {
    if (k.key == key) return &k;
  }
  return nullptr;
}

bool turns_on(const YAML::Node& value) {
  if (!value.IsDefined() || value.IsNull()) return false;
  if (!value.IsScalar()) return value.size() > 0;
  bool b = true;
  if (YAML::convert<bool>::decode(value, b)) return b;
  double d = 0;
  if (YAML::convert<double>::decode(value, d)) return d != 0;
  const std::string s = value.Scalar();
  return !(s.empty() || s == "none" || s == "None" || s == "no" || s == "null");
}

namespace {

// HyperParallelArguments' dtype spellings.
std::string canonical_dtype(const std::string& where, const nlohmann::json& v) {
  const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  if (s == "float32" || s == "fp32") return "float32";
  if (s == "bfloat16" || s == "bf16") return "bfloat16";
  if (s == "float16" || s == "fp16") {
    throw UserError(where + ": float16 is not supported (no fast fp16 CPU kernels, and fp16 needs loss scaling); use bf16");
  }
  throw UserError(where + ": " + excerpt(s) + " is not a dtype; expected float32 | fp32 | bfloat16 | bf16");
}

YAML::Node scalar(const nlohmann::json& v) { return YAML::Load(v.dump()); }

}  // namespace

std::vector<std::pair<std::string, YAML::Node>> read_hyper_parallel_args(const std::string& path) {
  const nlohmann::json j = io::read_user_json(path, io::kMaxSmallJsonBytes, "hyper_parallel_args");
  if (!j.is_object()) throw UserError("hyper_parallel_args " + path + " must hold a JSON object of HyperParallelArguments");
  std::vector<std::pair<std::string, YAML::Node>> out;
  for (const auto& [name, v] : j.items()) {
    const std::string where = "hyper_parallel_args " + path + ": " + excerpt(name, 60);
    if (v.is_null()) continue;
    if (name == "tp_size") {
      out.emplace_back("accelerator.tp_size", scalar(v));
    } else if (name == "cp_size") {
      out.emplace_back("accelerator.cp_size", scalar(v));
    } else if (name == "ep_size") {
      out.emplace_back("accelerator.ep_size", scalar(v));
    } else if (name == "efsdp_size") {
      out.emplace_back("fsdp_config.edp_shard_size", scalar(v));
    } else if (name == "fsdp_size") {
      out.emplace_back("fsdp_config.dp_shard_size", scalar(v));
    } else if (name == "reshard_after_forward") {
      out.emplace_back("fsdp_config.reshard_after_forward", scalar(v));
    } else if (name == "param_dtype") {
      out.emplace_back("fsdp_config.mix_precision.param_dtype", YAML::Node(canonical_dtype(where, v)));
    } else if (name == "reduce_dtype") {
      out.emplace_back("fsdp_config.mix_precision.reduce_dtype", YAML::Node(canonical_dtype(where, v)));
    } else if (name == "plan_overrides") {
      out.emplace_back("plan_overrides", scalar(v));
    } else if (name == "token_dispatcher") {
      if (v != "all_to_all") throw UserError(where + ": " + excerpt(v.dump()) + " is not supported; all_to_all is");
    } else if (name == "device_type") {
      if (v != "auto" && v != "cpu") throw UserError(where + ": " + excerpt(v.dump()) + ": this build runs on the CPU; use auto or cpu");
    } else if (name == "activation_mode") {
      if (v != "none" && v != "recompute" && v != "swap") {
        throw UserError(where + ": " + excerpt(v.dump()) + " is not one of none | recompute | swap");
      }
      // recompute: activation checkpointing of every decoder layer. swap (saved inputs moved
      // to host memory) is not implemented: the run keeps every activation, same numbers.
      if (v == "recompute") out.emplace_back("activation_checkpoint.mode", YAML::Node("full"));
    } else if (name == "activation_swap_inputs") {
      // Only meaningful with activation_mode: swap.
    } else {
      const std::vector<std::string> known = {"tp_size", "cp_size", "ep_size", "efsdp_size", "fsdp_size", "reshard_after_forward",
                                              "param_dtype", "reduce_dtype", "plan_overrides", "token_dispatcher", "device_type",
                                              "activation_mode", "activation_swap_inputs"};
      throw UserError(where + " is not a HyperParallelArguments field" + did_you_mean(name, known));
    }
  }
  return out;
}

}  // namespace hyperparallel::train::compat
