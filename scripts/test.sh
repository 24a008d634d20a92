#!/usr/bin/env bash
# Runs the whole test suite: installs what the build needs, runs every unit, property,
# snapshot and integration test (Cargo builds the binary the black-box tests spawn), then the
# deterministic simulation (its own --cfg madsim build: sim tests, determinism check, the
# fixed seed list) and the real-QEMU tier (a real libvirtd + QEMU guest; it says why and
# passes where the machine cannot run it).
#
#   scripts/test.sh            everything
#   scripts/test.sh --quick    only the cargo tests (no simulation, no real-QEMU tier)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
if [[ ${1:-} != --quick ]]; then
    # The tier's chroot and golden image build from Debian's packages (mostly download and
    # unpack): let that overlap the cargo builds; the tier's `ci` below waits for it.
    scripts/qemu-tier/run.sh prepare --background
fi
cargo test --locked --workspace
if [[ ${1:-} == --quick ]]; then
    exit 0
fi
scripts/sim.sh --ci
scripts/qemu-tier/run.sh ci
