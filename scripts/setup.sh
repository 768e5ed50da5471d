#!/usr/bin/env bash
# Installs everything hyperparallel needs to build, run its main job and its tests,
# from Debian's archive only. Idempotent: when every package is present it installs nothing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev        # LibTorch 1.13 (ATen, autograd, c10d with Gloo)
  libgloo-dev         # headers that c10d's ProcessGroupGloo.hpp includes
  libopenblas0-openmp # the libblas.so.3 alternative below; the reference BLAS is ~20x slower
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

# libblas.so.3, liblapack.so.3 and libopenblas.so.0 resolve through the alternatives system,
# each on its own. Select OpenBLAS's OpenMP build for all three: its GEMMs then run on
# LibTorch's OpenMP threads, so one process can use every core. The pthread build (preferred
# by priority when it is installed) keeps a second pool that competes with OpenMP's, and one
# name left on it loads both builds into a process (measured 25 % slower); a manual choice
# made earlier may pin the slow reference BLAS.
if [ "$(id -u)" -eq 0 ]; then
  for lib in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
    alt=$lib-x86_64-linux-gnu
    want=$(readlink -f /usr/lib/x86_64-linux-gnu/openblas-openmp/$lib 2>/dev/null || true)
    if [ -e "$want" ] && [ "$(readlink -f /etc/alternatives/$alt 2>/dev/null || true)" != "$want" ]; then
      update-alternatives --set "$alt" "/usr/lib/x86_64-linux-gnu/openblas-openmp/$lib" >/dev/null
    fi
  done
fi
echo "setup: ok"
