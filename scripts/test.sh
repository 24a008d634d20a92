#!/usr/bin/env bash
# Runs the whole test suite: installs what the build needs, builds and then runs every unit,
# property, snapshot and integration test (Cargo builds the binary the black-box tests spawn),
# then the deterministic simulation (its own --cfg madsim build: sim tests, determinism check,
# the fixed seed list) and the real-QEMU tier (a real libvirtd + QEMU guest; it says why and
# passes where the machine cannot run it).
#
#   scripts/test.sh            everything
#   scripts/test.sh --quick    only the cargo tests (no simulation, no real-QEMU tier)
#
# At the end, passed or failed, it prints the wall seconds and the outcome of each phase
# (scripts/phases.sh): the install, the cargo build of the tests, the cargo tests, the
# simulation and each step of the real-QEMU tier (waiting for its background prepare,
# prepare, start, the build of its tests, each test group, the benchmark, stop). A phase that
# failed shows with its exit status; the phases after it did not run. Under .ci/run the
# phases join .ci/run's table instead.
set -euo pipefail
cd "$(dirname "$0")/.."

case ${1:-} in
"" | --quick) ;;
*)
    echo "usage: $0 [--quick]" >&2
    exit 2
    ;;
esac

# shellcheck source=scripts/phases.sh
source scripts/phases.sh

phase install scripts/install-deps.sh
if [[ ${1:-} != --quick ]]; then
    # The tier's chroot and golden image build from Debian's packages (mostly download and
    # unpack): let that overlap the cargo builds; the tier's `ci` below waits for it.
    phase "tier: background prepare started" scripts/qemu-tier/run.sh prepare --background
fi
# The SBOM test (tests/tests/image.rs) runs deploy/sbom.sh, which needs cargo-cyclonedx: built
# here, on its own, when missing (a fresh machine), rather than by the test amid the others.
phase "install cargo-cyclonedx" scripts/install-cargo-tools.sh cargo-cyclonedx
# Every package of Cargo.lock, for every target and cfg (the simulation's `--cfg madsim`
# crates too): the tidy test that reads `cargo tree` runs it offline, and a fresh machine's
# registry holds only what the builds before it downloaded.
phase "cargo fetch" cargo fetch --locked
phase "cargo build (tests)" cargo test --locked --workspace --no-run
# Four test threads on the two cores: most of the long tests wait (timeouts, slow readers,
# a stopped daemon) rather than compute. Measured here, the whole `cargo test` took 238 s
# with four and about 320 s with the default two; every liveness bound in the tests holds
# under `stress-ng --cpu 2` beside two threads, a heavier load than two more threads.
phase "cargo tests" cargo test --locked --workspace -- --test-threads=4
if [[ ${1:-} == --quick ]]; then
    exit 0
fi
phase simulation scripts/sim.sh --ci
phase "tier: total" scripts/qemu-tier/run.sh ci
