#!/usr/bin/env python3
"""Our trainer against LlamaFactory itself on LlamaFactory's own example config (scripts/bench_vs_llamafactory.sh).

Design. One YAML (benchmarks/llamafactory_qwen3_full_sft.yaml, LlamaFactory's
examples/train_full/qwen3_full_sft.yaml with the benchmark's model, data and step count) is
run by `llamafactory-cli train` in LlamaFactory's own environment and by `hyperparallel train`,
same model folder, same data file, same steps; modes are interleaved over --rounds so a change
in the machine's load reaches both alike. Each launch is measured from outside:
  wall_s      the whole command (start-up, tokenization, model load, the steps, the final save):
              the time a user waits for step N;
  step_s      the median of the logged steps' times after the first two (ours: elapsed_s per
              line; LlamaFactory's log has whole seconds, so the slope over the steps);
  peak_rss    the process's high-water mark (getrusage of the waited child: the largest of the
              process tree); ours on several ranks: every rank's, from train_summary.json;
  loss        the last logged loss; tokens_per_s from our log (real tokens, no padding).
Only the standard library: it runs with any Python.
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def render_yaml(path, model, data, out, steps, bf16, extra=""):
    with open(os.path.join(HERE, "llamafactory_qwen3_full_sft.yaml")) as f:
        text = f.read()
    for key, value in (("@MODEL@", model), ("@DATA@", data), ("@OUT@", out), ("@STEPS@", str(steps)),
                       ("@BF16@", "true" if bf16 else "false")):
        text = text.replace(key, value)
    with open(path, "w") as f:
        f.write(text + extra)
    return path


def run_measured(command, env, log_path):
    """Runs `command`; returns (exit code, wall seconds, max RSS in MiB of the largest process of its
    tree). getrusage(RUSAGE_CHILDREN) keeps a running maximum over every child waited for, so each
    launch runs in a fresh helper process (measure_once) where this command is the only one."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        code = subprocess.call(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    return code, wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def elapsed_seconds(record):
    if "elapsed_s" in record:
        return float(record["elapsed_s"])
    h, m, s = (float(x) for x in record["elapsed_time"].split(":"))
    return h * 3600 + m * 60 + s


def read_log(out):
    path = os.path.join(out, "trainer_log.jsonl")
    records = []
    if os.path.exists(path):
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    records = [r for r in records if "loss" in r]
    if not records:
        return {}
    t = [elapsed_seconds(r) for r in records]
    steps = [int(r.get("current_steps", r.get("step", i + 1))) for i, r in enumerate(records)]
    if "elapsed_s" in records[0]:
        step_s = statistics.median(b - a for a, b in zip(t[2:], t[3:])) if len(t) > 3 else float("nan")
    else:  # whole seconds: the slope from the third logged step to the last
        step_s = (t[-1] - t[2]) / (steps[-1] - steps[2]) if len(t) > 3 and steps[-1] > steps[2] else float("nan")
    result = {"loss": records[-1]["loss"], "step_s": step_s, "steps": steps[-1]}
    tps = [r["tokens_per_s"] for r in records[2:] if "tokens_per_s" in r]
    if tps:
        result["tokens_per_s"] = statistics.median(tps)
    return result


def rank_peaks(out):
    path = os.path.join(out, "train_summary.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        summary = json.load(f)
    return [b / 2**20 for b in summary.get("peak_rss_bytes", [])]


def measure_once(args):
    """In a fresh process: one launch, its numbers as one JSON line on stdout."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", DISABLE_VERSION_CHECK="1")
    out = os.path.join(args.work, "out_" + args.name)
    extra = ""
    if args.ranks > 1:  # ours only: the same global batch of 4 rows over FSDP ranks
        extra = (f"nproc_per_node: {args.ranks}\nfsdp_config: {{dp_shard_size: {args.ranks}}}\n"
                 f"per_device_train_batch_size: {4 // args.ranks}\ngradient_accumulation_steps: 1\n")
    if args.checkpointing:  # LlamaFactory's default; ours is off unless asked for
        extra += "gradient_checkpointing: true\n"
    if args.bf16:  # transformers refuses bf16 on a machine without a GPU unless told to use the CPU
        extra += "use_cpu: true\n"
    yaml_path = render_yaml(os.path.join(args.work, args.name + ".yaml"), args.model, args.data, out, args.steps, args.bf16)
    if extra:  # appended; keys the template has are removed first (a YAML key once)
        with open(yaml_path) as f:
            text = f.read()
        for key in re.findall(r"(?m)^(\w+):", extra):
            text = re.sub(rf"(?m)^{key}:.*\n", "", text)
        with open(yaml_path, "w") as f:
            f.write(text + extra)
    if args.trainer == "llamafactory":
        command = [args.llamafactory_cli, "train", yaml_path]
    else:
        command = [args.hyperparallel, "train", yaml_path]
    code, wall, peak = run_measured(command, env, os.path.join(args.work, args.name + ".log"))
    result = {"name": args.name, "exit": code, "wall_s": wall, "peak_rss_mib": peak}
    result.update(read_log(out))
    ranks = rank_peaks(out)
    if ranks:
        result["rank_peak_rss_mib"] = ranks
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure-once", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--name")
    parser.add_argument("--trainer", choices=["llamafactory", "hyperparallel"])
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hyperparallel", required=True)
    parser.add_argument("--llamafactory-cli", required=True)
    # bf16 (lf_bf16, hp_bf16) is opt-in: on a CPU without AVX512_BF16 LibTorch's bf16 GEMMs
    # run at 0.3-12 GFLOP/s against fp32's 45-60 (docs/benchmarks.md), a step takes minutes.
    # hp_fp32_gc: ours with gradient_checkpointing: true, which LlamaFactory does by default (its
    # disable_gradient_checkpointing: false): the same recompute on both sides.
    parser.add_argument("--modes", default="lf_fp32,hp_fp32,hp_fp32_gc,hp_fp32_fsdp2,hp_fp32_fsdp4")
    args = parser.parse_args()
    if args.measure_once:
        measure_once(args)
        return
    os.makedirs(args.work, exist_ok=True)
    modes = {
        "lf_fp32": ("llamafactory", 1, False, False), "hp_fp32": ("hyperparallel", 1, False, False),
        "hp_fp32_gc": ("hyperparallel", 1, False, True),
        "hp_fp32_fsdp2": ("hyperparallel", 2, False, False), "hp_fp32_fsdp4": ("hyperparallel", 4, False, False),
        "lf_bf16": ("llamafactory", 1, True, False), "hp_bf16": ("hyperparallel", 1, True, False),
    }
    chosen = args.modes.split(",")
    results = {m: [] for m in chosen}
    for round_ in range(1, args.rounds + 1):
        for mode in chosen:
            trainer, ranks, bf16, checkpointing = modes[mode]
            threads = max(1, args.threads // ranks)
            command = [sys.executable, __file__, "--measure-once", "--name", mode, "--trainer", trainer, "--ranks", str(ranks),
                       "--model", args.model, "--data", args.data, "--work", args.work, "--steps", str(args.steps),
                       "--threads", str(threads), "--hyperparallel", args.hyperparallel,
                       "--llamafactory-cli", args.llamafactory_cli] + (["--bf16"] if bf16 else []) + \
                      (["--checkpointing"] if checkpointing else [])
            line = subprocess.run(command, capture_output=True, text=True).stdout.strip().splitlines()
            r = json.loads(line[-1]) if line else {"exit": -1}
            results[mode].append(r)
            with open(os.path.join(args.work, "launches.jsonl"), "a") as f:
                f.write(json.dumps(dict(r, round=round_)) + "\n")
            print(f"launch {round_} {mode}: " + json.dumps(r), flush=True)
    print_table(results, args)


def median_of(runs, key):
    values = [r[key] for r in runs if r.get("exit") == 0 and key in r]
    return statistics.median(values) if values else float("nan")


def print_table(results, args):
    print(f"\n{args.steps} steps, global batch 4 x cutoff_len 512, {args.threads} threads in all, medians of "
          f"{args.rounds} interleaved launches")
    print("| mode | wall s to step N | step s | tokens/s (ours) | peak RSS MiB (per rank) | loss at N | exit |")
    print("|---|---|---|---|---|---|---|")
    for mode, runs in results.items():
        ranks = [r.get("rank_peak_rss_mib") for r in runs if r.get("rank_peak_rss_mib")]
        per_rank = ("max " + f"{max(max(x) for x in ranks):.0f}" if ranks and len(ranks[0]) > 1 else "")
        print(f"| {mode} | {median_of(runs, 'wall_s'):.1f} | {median_of(runs, 'step_s'):.2f} | "
              f"{median_of(runs, 'tokens_per_s'):.0f} | {median_of(runs, 'peak_rss_mib'):.0f} {per_rank} | "
              f"{median_of(runs, 'loss'):.4f} | {','.join(str(r.get('exit')) for r in runs)} |")
    for ours, theirs in (("hp_fp32", "lf_fp32"), ("hp_fp32_gc", "lf_fp32"), ("hp_bf16", "lf_bf16")):
        if ours in results and theirs in results:
            for key in ("peak_rss_mib", "wall_s", "step_s"):
                a, b = median_of(results[ours], key), median_of(results[theirs], key)
                print(f"RATIO {ours} / {theirs} {key} = {a / b:.3f}")


if __name__ == "__main__":
    main()
