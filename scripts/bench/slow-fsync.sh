#!/usr/bin/env bash
# Runs the durability benchmark as if the disk's flush took SLOW_FSYNC_US extra
# microseconds (default 2000): an LD_PRELOAD shim (scripts/bench/slow-fsync.c) delays every
# fsync/fdatasync of the benchmark process, the raw-fsync probe and redb's commits alike.
# On a disk whose fsync is cheaper than the provider's per-call CPU, group commit cannot
# show; this shows it where fsync is the bottleneck, next to the real disk's run.
#
#   scripts/bench/slow-fsync.sh            SLOW_FSYNC_US=5000 scripts/bench/slow-fsync.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

out=target/bench-shim
mkdir -p "$out"
gcc -O2 -shared -fPIC -o "$out/slow-fsync.so" scripts/bench/slow-fsync.c -ldl
# Build first, so the shim only ever sees the benchmark, not cargo or the compiler.
cargo bench --locked -p bigfleet-libvirt --bench durability --no-run
bench=$(cargo bench --locked -p bigfleet-libvirt --bench durability --no-run \
    --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*durability[^"]*\)".*/\1/p' | tail -1)
[[ -x $bench ]] || { echo "could not find the durability benchmark executable" >&2; exit 1; }
echo "every fsync/fdatasync delayed by ${SLOW_FSYNC_US:-2000} us (LD_PRELOAD $out/slow-fsync.so)"
SLOW_FSYNC_US=${SLOW_FSYNC_US:-2000} LD_PRELOAD=$PWD/$out/slow-fsync.so "$bench" --bench
