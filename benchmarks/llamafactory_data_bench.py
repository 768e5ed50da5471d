"""LlamaFactory's data preparation on a training config, timed like benchmarks/data_bench.cpp.

Run with LlamaFactory's own environment's python (scripts/bench_data.sh):
    python benchmarks/llamafactory_data_bench.py CONFIG.yaml WORKERS
Loads the tokenizer and template as LlamaFactory's SFT workflow does, then times get_dataset
(load, convert, tokenize with WORKERS processes) with overwrite_cache so HF datasets does
not reuse an earlier run. Prints one RESULT line: seconds, rows, tokens, resident growth.
"""

import resource
import sys
import time

import yaml


def resident_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def main() -> None:
    config_path, workers = sys.argv[1], int(sys.argv[2])
    with open(config_path) as f:
        args = yaml.safe_load(f)
    args["preprocessing_num_workers"] = workers
    args["overwrite_cache"] = True
    args.pop("deepspeed", None)

    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    model_args, data_args, training_args, _, _ = get_train_args(args)
    tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    before = resident_mib()
    start = time.perf_counter()
    module = get_dataset(template, model_args, data_args, training_args, stage="sft", **tokenizer_module)
    seconds = time.perf_counter() - start
    train = module["train_dataset"]
    tokens = sum(len(ids) for ids in train["input_ids"])
    print(
        f"RESULT seconds={seconds:.3f} rows={len(train)} tokens={tokens} "
        f"resident_growth_mib={resident_mib() - before:.1f} threads={workers} "
        f"peak_rss_mib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
