# Sourced by the bench_*.sh scripts: the header and footer every benchmark record carries
# (docs/benchmarks.md): commit, date, cores, CPU model, the flags that decide the kernels, the BLAS and threads,
# load average before (with a warning when the machine is busy) and after; and `interleave`,
# the launch harness whose numbers can be compared within one run.
cpu_flags() {
  grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_bf16)$' | tr '\n' ' ' | sed 's/ $//'
}
bench_header() {
  local load1
  load1=$(cut -d' ' -f1 /proc/loadavg)
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d), $(nproc) cores," \
       "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), flags: $(cpu_flags), load $(cut -d' ' -f1-3 /proc/loadavg)"
  # The wheel's LibTorch carries MKL in libtorch_cpu.so; the system's libblas.so.3 matters only to
  # a LibTorch of the user's own built against it (docs/building.md "BLAS and threads").
  echo "blas: MKL in LibTorch's libtorch_cpu.so (system libblas.so.3:" \
       "$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo none), unused by the wheel)," \
       "OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
  if awk -v l="$load1" -v n="$(nproc)" 'BEGIN { exit !(l > 0.25 * n) }'; then
    echo "WARNING: the machine is loaded (load $load1 on $(nproc) cores): launches swing; read the min-max spread"
  fi
}
bench_footer() {
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# interleave LAUNCHES NAME COMMAND [NAME COMMAND ...]
# Runs the commands round-robin, LAUNCHES rounds (A B C A B C ...), so a change in the
# machine's load reaches every mode alike. Each command prints a RESULT line with step_ms=
# (the median step of that launch). Prints one line per launch, then per mode a SUMMARY: the
# median of its launches' step_ms and their min-max, and its last RESULT line; sets
# MEDIAN_MS[NAME] for the caller's ratios.
declare -gA MEDIAN_MS
interleave() {
  local launches=$1
  shift
  local -a names=() commands=()
  while (($#)); do
    names+=("$1")
    commands+=("$2")
    shift 2
  done
  local tmp line ms
  tmp=$(mktemp -d)
  for ((round = 1; round <= launches; round++)); do
    for i in "${!names[@]}"; do
      line=$(bash -c "${commands[$i]}" | grep '^RESULT' | tail -1 || true)
      ms=$(sed -n 's/.*step_ms=\([0-9.]*\).*/\1/p' <<<"$line")
      if [ -z "$ms" ]; then
        echo "launch $round ${names[$i]}: no RESULT line" >&2
        continue
      fi
      echo "$line" >>"$tmp/$i.lines"
      echo "$ms" >>"$tmp/$i.ms"
      echo "launch $round ${names[$i]}: $ms ms, load $(cut -d' ' -f1 /proc/loadavg)"
    done
  done
  for i in "${!names[@]}"; do
    [ -s "$tmp/$i.ms" ] || continue
    local summary
    summary=$(sort -n "$tmp/$i.ms" | awk -v name="${names[$i]}" '{ v[NR] = $1 } END {
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "SUMMARY mode=%s launches=%d median_ms=%.1f min_ms=%.1f max_ms=%.1f spread=%.0f%%\n", name, NR, m, v[1], v[NR], (v[NR] - v[1]) / m * 100 }')
    echo "$summary"
    echo "  last launch: $(tail -1 "$tmp/$i.lines")"
    MEDIAN_MS[${names[$i]}]=$(sed -n 's/.*median_ms=\([0-9.]*\).*/\1/p' <<<"$summary")
  done
  rm -rf "$tmp"
}

# ratio A B: A's median over B's, from the last interleave.
ratio() {
  if [ -n "${MEDIAN_MS[$1]:-}" ] && [ -n "${MEDIAN_MS[$2]:-}" ]; then
    awk -v a="${MEDIAN_MS[$1]}" -v b="${MEDIAN_MS[$2]}" -v na="$1" -v nb="$2" 'BEGIN { printf "RATIO %s / %s = %.3f\n", na, nb, a / b }'
  fi
}
