#!/usr/bin/env bash
# Runs the deterministic simulation (sim/README.md). One command for everything:
#   scripts/sim.sh --seed N [--trace]         one seed: its plan, verdict and trace hash
#   scripts/sim.sh --seeds A..B | A..=B       a sweep (more: --jobs J --stop-at-first --quiet)
#   scripts/sim.sh --ci                       CI: sim tests, the fixed seed list, determinism
#   scripts/sim.sh --bugs                     each injected bug must be caught by a sweep
#   scripts/sim.sh --features bug-x --seed N  replay a seed of a bug build
# The simulation build uses RUSTFLAGS="--cfg madsim" in its own target dir (target/sim), so
# it never invalidates the normal build.
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg madsim"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_SIM:-target/sim}"
jobs=$(nproc 2>/dev/null || echo 2)
bugs=(
    bug-fence-after-idempotency
    bug-ack-before-persist
    bug-keep-metadata-on-drain
    bug-no-create-compensation
    bug-no-delete-compensation
    bug-per-shard-fence
    bug-transition-after-commit
    bug-detached-transition-span
    bug-lanes-over-budget
    bug-spread-busiest
    bug-rollback-leaks-a-volume
    bug-rollback-forgets-a-claim
    bug-drain-skips-the-host
)

sim() { # [--features F] -- runner args
    local features=() target=$CARGO_TARGET_DIR
    if [[ ${1:-} == --features ]]; then
        # Bug builds get their own target dir so they never invalidate the clean one.
        features=(--features "$2") target="$CARGO_TARGET_DIR-bugs"
        shift 2
    fi
    CARGO_TARGET_DIR=$target cargo run --locked --quiet --profile sim -p bigfleet-libvirt-sim \
        "${features[@]}" --bin sim -- "$@"
}

case "${1:-}" in
--ci)
    start=$SECONDS
    cargo build --locked --profile sim -p bigfleet-libvirt-sim --bins --tests
    echo "sim build: $((SECONDS - start))s"
    cargo test --locked --profile sim -p bigfleet-libvirt-sim
    sim --check-determinism 7
    sim --seeds-file sim/seeds.txt --jobs "$jobs" --quiet
    echo "sim CI total: $((SECONDS - start))s"
    ;;
--bugs)
    for bug in "${bugs[@]}"; do
        echo "== $bug"
        sim --features "$bug" --seeds "${2:-1..=200}" --jobs "$jobs" --stop-at-first --expect-failure \
            | grep -E '^(sweep|  [a-z-]+ violated|first failing seed|replay)'
    done
    ;;
--features)
    [[ $# -ge 3 ]] || { echo "usage: scripts/sim.sh --features bug-x --seed N" >&2; exit 2; }
    sim "$@"
    ;;
"" | -h | --help)
    sed -n '2,9p' "$0"
    ;;
*)
    sim "$@"
    ;;
esac
