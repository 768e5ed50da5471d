#!/usr/bin/env bash
# The test InstallAndConsume (tests/CMakeLists.txt): the library is installable and usable from
# another project, as docs/building.md "Installing and using the library" describes.
#   scripts/check_install.sh BUILD_DIR [CMAKE [CXX]]
# 1. cmake --install BUILD_DIR into a fresh temporary prefix;
# 2. the installed CMake package names no path of this source tree or of BUILD_DIR;
# 3. examples/, copied out of the tree, configures on its own with find_package(hyperparallel)
#    from that prefix and builds fsdp_custom_module as C++20 (the library itself is C++17: this
#    is the mix a C++20 user of LibTorch 2.x has, our public headers and LibTorch's compiled as
#    C++20 and linked against a C++17 archive);
# 4. the installed tool runs it on 2 ranks and rank 0 reports its last step.
# The consumer compiles one file (~10 s cold on 2 cores, ~2 s in all warm): the work folder
# is the ccache base dir, so the cache key holds no temporary path.
set -euo pipefail
build=$(cd "${1:?usage: check_install.sh BUILD_DIR [CMAKE [CXX]]}" && pwd)
cmake=${2:-cmake}
cxx=${3:-c++}
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/hp_install_check.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
log=$work/log

step() { echo "install check: $*"; }
fail() { echo "install check: FAILED: $*" >&2; [[ -f "$log" ]] && tail -n 60 "$log" >&2; exit 1; }

step "installing $build into a temporary prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$log" 2>&1 || fail "cmake --install"
for f in bin/hyperparallel lib/libhp_core.a lib/libhp_launch.a include/hyperparallel/fsdp/fully_shard.h \
         lib/cmake/hyperparallel/hyperparallelConfig.cmake lib/cmake/hyperparallel/hyperparallelConfigVersion.cmake \
         lib/cmake/hyperparallel/hyperparallelTargets.cmake; do
  [[ -e "$prefix/$f" ]] || fail "the install lacks $f"
done
# A path of the build machine's tree in the package would break it for every other user.
if grep -rn -e "$src" -e "$build" "$prefix/lib/cmake/hyperparallel"; then
  fail "the installed package names the source or build tree (above)"
fi

step "building examples/ against it with find_package(hyperparallel)"
cp -r "$src/examples" "$work/examples"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=$work CCACHE_NOHASHDIR=true
  # The copied and installed files are seconds old; their contents, not their times, matter.
  export CCACHE_SLOPPINESS=include_file_mtime,include_file_ctime
fi
# The consumer names the LibTorch it builds against, as a user does (docs/building.md): the one
# the build used.
torch_dir=$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt")
[[ -n "$torch_dir" ]] || fail "no Torch_DIR in $build/CMakeCache.txt"
"$cmake" -S "$work/examples" -B "$work/consumer" "${generator[@]}" "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=20 -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" -DTorch_DIR="$torch_dir" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$log" 2>&1 || fail "configuring the consumer"
found=$(sed -n 's/^hyperparallel_DIR:PATH=//p' "$work/consumer/CMakeCache.txt")
[[ "$found" == "$prefix/lib/cmake/hyperparallel" ]] || fail "find_package found '$found', not the temporary prefix"
grep -q '^CMAKE_CXX_STANDARD:UNINITIALIZED=20$' "$work/consumer/CMakeCache.txt" || fail "the consumer is not configured as C++20"
"$cmake" --build "$work/consumer" --target fsdp_custom_module >"$log" 2>&1 || fail "building the consumer"

step "running it on 2 ranks with the installed tool"
"$prefix/bin/hyperparallel" run --nproc-per-node 2 -- "$work/consumer/fsdp_custom_module" >"$log" 2>&1 \
  || fail "the consumer's run"
grep -q '^\[rank 0\] step 9 loss' "$log" || fail "no '[rank 0] step 9 loss' in the consumer's output"
grep '^\[rank 0\] step 9 loss' "$log"
step "passed"
