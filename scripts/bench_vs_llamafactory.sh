#!/usr/bin/env bash
# Our trainer against LlamaFactory 0.9.5 itself, on its own example config
# (benchmarks/llamafactory_qwen3_full_sft.yaml), the same model folder and data:
#   scripts/bench_vs_llamafactory.sh [BUILD_DIR]
# 1. LlamaFactory's environment, outside the clone keyed by scripts/requirements-llamafactory.txt's
#    hash (first run: a pip install of ~5 GB; HP_LF_ENV names another);
# 2. the model: a 103 M Qwen3 with the real 151,936-token vocabulary and the real Qwen3 tokenizer,
#    made by scripts/make_hf_fixtures.py --model-only in the project's environment;
# 3. the data: scripts/make_chat_data.py (1000 chat conversations, a long-tailed length spread);
# 4. benchmarks/llamafactory_bench.py: interleaved launches, the table and ratios.
# Environment: STEPS (12), ROUNDS (2), MODES (lf_fp32,hp_fp32,hp_fp32_gc,hp_fp32_fsdp2,hp_fp32_fsdp4; hp_fp32_gc checkpoints activations as LlamaFactory does by default; add
# lf_bf16,hp_bf16 on a CPU with AVX512_BF16), WORK (/tmp/hp_bench_lf).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
source scripts/bench_lib.sh
python_env=$(scripts/python_env.sh)
[ -x "$python_env/bin/python" ] || { echo "bench_vs_llamafactory: run scripts/setup.sh first (no $python_env)" >&2; exit 2; }
[ -x "$build/hyperparallel" ] || { echo "bench_vs_llamafactory: no $build/hyperparallel; build first (make build)" >&2; exit 2; }
lf_hash=$(sha256sum scripts/requirements-llamafactory.txt | cut -c1-12)
lf_env=${HP_LF_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperparallel/lfenv-$lf_hash}
if [ ! -x "$lf_env/bin/llamafactory-cli" ]; then
  echo "bench_vs_llamafactory: installing LlamaFactory's environment in $lf_env"
  rm -rf "$lf_env"
  /usr/bin/python3 -m venv "$lf_env"
  "$lf_env/bin/pip" install -q --disable-pip-version-check --no-input -r scripts/requirements-llamafactory.txt
fi
work=${WORK:-/tmp/hp_bench_lf}
mkdir -p "$work"
model=$work/qwen3_103m
if [ ! -f "$model/config.json" ]; then
  "$python_env/bin/python" scripts/make_hf_fixtures.py --model-only --archs qwen3 --out "$model" \
    --set vocab_size=151936 hidden_size=512 intermediate_size=1536 num_hidden_layers=8 num_attention_heads=8 \
          num_key_value_heads=4 head_dim=64 initializer_range=0.02 max_position_embeddings=4096 \
    --tokenizer tests/fixtures/tokenizer/qwen3
fi
[ -f "$work/data/chat_demo.json" ] || "$python_env/bin/python" scripts/make_chat_data.py --out "$work/data/chat_demo.json"
bench_header
echo "LlamaFactory: $("$lf_env/bin/python" -c 'import llamafactory, torch, transformers; print(llamafactory.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null)"
"$python_env/bin/python" benchmarks/llamafactory_bench.py --model "$model" --data "$work/data" --work "$work" \
  --steps "${STEPS:-12}" --rounds "${ROUNDS:-2}" --threads "$(nproc)" ${MODES:+--modes "$MODES"} \
  --hyperparallel "$(cd "$build" && pwd)/hyperparallel" --llamafactory-cli "$lf_env/bin/llamafactory-cli"
bench_footer
