# Sourced by the bench_*.sh scripts: the header and footer every benchmark record carries
# (docs/benchmarks.md): commit, date, cores, CPU model, load average before and after.
bench_header() {
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d), $(nproc) cores," \
       "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
}
bench_footer() {
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
}
