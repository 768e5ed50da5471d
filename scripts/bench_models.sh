#!/usr/bin/env bash
# Model throughput next to a matmul roofline (with and without plan_overrides), and peak RSS
# of loading a ~290 MB checkpoint whole vs sharded over 4 ranks, in one run (docs/benchmarks.md).
set -euo pipefail
# shellcheck source=bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
build=${1:-build}
steps=${STEPS:-5}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bench_header
# bf16 modes only where a bf16 matmul is fast (AVX512_BF16 or AMX-BF16; docs/config.md "bf16").
bf16_flag=()
grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && bf16_flag=(--bf16)
"$build/model_bench" "$steps" "${bf16_flag[@]}"
"$build/load_bench" prepare "$dir/model"
"$build/load_bench" full "$dir/model" | grep RESULT
"$build/hyperparallel" run --no-prefix --nproc-per-node 4 -- "$build/load_bench" sharded "$dir/model" | grep RESULT | sort
