#!/usr/bin/env bash
# make fuzz: builds the libFuzzer targets in fuzz/ with clang (ASan + UBSan) into build-fuzz/
# and runs each for FUZZ_SECONDS (default 60) from its seed corpus in fuzz/corpus/<target>.
# New interesting inputs go to build-fuzz/corpus/<target>; a finding (crash, sanitizer report,
# an exception other than UserError) leaves build-fuzz/crashes/<target>-* and fails the run.
#   scripts/fuzz.sh [TARGET ...]     (default: every target)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
out=build-fuzz
cxx=$(command -v clang++-14 || command -v clang++ || true)
if [[ -z "$cxx" ]]; then
  echo "fuzz: clang++ is missing; run 'scripts/setup.sh' as root (it installs clang-14 and libclang-rt-14-dev)" >&2
  exit 2
fi
launcher=$(command -v ccache || true)
mkdir -p "$out/obj" "$out/crashes"

# LibTorch: the torch wheel of the project's Python environment (scripts/setup.sh).
torch_dir=$("$(scripts/python_env.sh)/bin/python" -c "import os, torch; print(os.path.dirname(torch.__file__))" 2>/dev/null) || {
  echo "fuzz: the project's Python environment has no torch; run 'scripts/setup.sh'" >&2
  exit 2
}
common=(-std=c++17 -O1 -g -fno-omit-frame-pointer -D_GLIBCXX_USE_CXX11_ABI=1 -Iinclude -Isrc
        -isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include"
        -fsanitize=address,undefined -fno-sanitize-recover=undefined
        -DHP_FUZZ_TOKENIZER="\"$PWD/examples/tokenizer\"")

# target: its library sources and libraries
declare -A sources=(
  [safetensors]="src/io/safetensors.cpp src/io/user_files.cpp"
  [tokenizer]="src/data/tokenizer.cpp src/data/bpe_model.cpp src/data/utf8.cpp src/io/user_files.cpp src/platform/suggest.cpp"
  [tokenizer_encode]="src/data/tokenizer.cpp src/data/bpe_model.cpp src/data/utf8.cpp src/io/user_files.cpp src/platform/suggest.cpp"
  [config]="src/train/train_config.cpp src/train/train_config_keys.cpp src/train/hyperparallel_yaml.cpp src/cp/cp_options.cpp src/train/config_values.cpp src/train/llamafactory_compat.cpp src/platform/suggest.cpp src/io/user_files.cpp"
  [dataset]="src/data/sft_dataset.cpp src/data/dataset_records.cpp src/data/tool_calls.cpp src/data/python_json.cpp src/data/utf8.cpp src/data/chat_template.cpp src/platform/suggest.cpp src/io/user_files.cpp"
  [store]="src/comm/store_server.cpp src/comm/store_protocol.cpp"
)
declare -A libs=(
  [safetensors]="-lstdc++ -L$torch_dir/lib -Wl,-rpath,$torch_dir/lib -ltorch_cpu -lc10"
  [tokenizer]="-lonig -lutf8proc"
  [tokenizer_encode]="-lonig -lutf8proc"
  [config]="-lyaml-cpp"
  [dataset]=""
  [store]="-lstdc++ -L$torch_dir/lib -Wl,-rpath,$torch_dir/lib -ltorch_cpu -lc10 -lpthread"
)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(safetensors tokenizer tokenizer_encode config dataset store)

compile() {  # source -> object, instrumented for coverage but without libFuzzer's main
  local src=$1 obj="$out/obj/$(echo "$1" | tr / _).o"
  if [[ ! -f "$obj" || "$src" -nt "$obj" ]]; then
    $launcher "$cxx" "${common[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
  fi
  echo "$obj"
}

failed=()
for t in "${targets[@]}"; do
  [[ -n "${sources[$t]+x}" ]] || { echo "fuzz: unknown target '$t'; targets: ${!sources[*]}" >&2; exit 2; }
  objs=()
  for s in ${sources[$t]}; do objs+=("$(compile "$s")"); done
  echo "fuzz: building $t" >&2
  # shellcheck disable=SC2086
  "$cxx" "${common[@]}" -fsanitize=fuzzer "fuzz/${t}_fuzz.cpp" "${objs[@]}" ${libs[$t]} -o "$out/$t"
  mkdir -p "$out/corpus/$t"
  echo "fuzz: running $t for ${seconds}s" >&2
  if ! "$out/$t" -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=20 -print_final_stats=1 \
       -artifact_prefix="$out/crashes/$t-" "$out/corpus/$t" "fuzz/corpus/$t" > "$out/$t.log" 2>&1; then
    failed+=("$t")
    tail -40 "$out/$t.log" >&2
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$out/$t.log" | sed "s/^/fuzz: $t: /" >&2
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: findings in: ${failed[*]} (inputs in $out/crashes/)" >&2
  exit 1
fi
echo "fuzz: no findings in ${targets[*]}" >&2
