#!/usr/bin/env bash
# Installs everything hyperparallel needs to build, run its main job and its tests: Debian
# packages, then the project's Python environment (LibTorch from the pinned torch wheel and the
# Python peers of scripts/requirements.txt) outside the clone (scripts/python_env.sh).
# Idempotent: when everything is present it installs and downloads nothing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  python3 python3-venv  # the Python environment below (LibTorch is the torch wheel in it)
  libgloo-dev         # headers that c10d's ProcessGroupGloo.hpp includes (the wheel has none)
  nlohmann-json3-dev  # JSON: config.json, safetensors headers and indexes
  libonig-dev libutf8proc-dev  # tokenizer: the reference's regex engine, NFC normalization
  libyaml-cpp-dev     # the trainer's YAML configs
  librsvg2-bin        # rsvg-convert: training_loss.png next to the SVG
  clang-14 libclang-rt-14-dev  # make fuzz: libFuzzer with ASan + UBSan
  libgtest-dev libgmock-dev
  python3-jinja2      # tests: exported chat templates rendered as transformers renders them
  python3-protobuf    # tests: TensorBoard event files parsed by the protobuf runtime
  iproute2 procps
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]}" >&2
    echo "setup: run 'sudo scripts/setup.sh' (or 'apt-get install ${missing[*]}' as root)" >&2
    exit 2
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Python environment: one per requirements hash, made once per machine. A half-made one
# (an interrupted install) has no .complete marker and is made again.
env_dir=$("$(dirname "$0")/python_env.sh")
requirements="$(cd "$(dirname "$0")" && pwd)/requirements.txt"
if [ ! -f "$env_dir/.complete" ]; then
  echo "setup: making the Python environment $env_dir (torch wheel ~4.6 GB, about 2-3 minutes)"
  rm -rf "$env_dir"
  mkdir -p "$(dirname "$env_dir")"
  /usr/bin/python3 -m venv "$env_dir"
  "$env_dir/bin/pip" install -q --disable-pip-version-check --no-input -r "$requirements"
  "$env_dir/bin/python" -c "import torch; assert torch.__version__.startswith('2.11.0'), torch.__version__"
  touch "$env_dir/.complete"
fi
echo "setup: ok"
