#!/usr/bin/env bash
# Installs everything hyperparallel needs to build, run its main job and its tests,
# from Debian's archive only. Idempotent: when every package is present it installs nothing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev        # LibTorch 1.13 (ATen, autograd, c10d with Gloo)
  libgloo-dev         # headers that c10d's ProcessGroupGloo.hpp includes
  libopenblas0-pthread # becomes the libblas.so.3 alternative; the reference BLAS is ~20x slower
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

# libopenblas0-pthread registers itself as the libblas.so.3 alternative with a higher
# priority than the reference BLAS; a manual choice made earlier would pin the slow one.
if [ "$(id -u)" -eq 0 ]; then
  alt=libblas.so.3-x86_64-linux-gnu
  if update-alternatives --query "$alt" >/dev/null 2>&1; then
    current=$(readlink -f /etc/alternatives/$alt || true)
    case "$current" in
      *openblas*) ;;
      *) update-alternatives --auto "$alt" >/dev/null
         update-alternatives --auto liblapack.so.3-x86_64-linux-gnu >/dev/null 2>&1 || true ;;
    esac
  fi
fi
echo "setup: ok"
