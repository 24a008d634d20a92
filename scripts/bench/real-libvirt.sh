#!/usr/bin/env bash
# The real-libvirt benchmark (tests/benches/real_libvirt.rs): the provider binary over gRPC
# against the real-QEMU tier's two libvirtd zones, next to the bare sequence of the same
# libvirt calls. Prints its numbers and writes target/bench/real-libvirt.json; fails only
# when a call errors, never on a timing.
#
# Run it in a started tier (scripts/qemu-tier/run.sh ci runs it after the tier's tests):
#   scripts/qemu-tier/run.sh prepare && scripts/qemu-tier/run.sh start
#   eval "$(scripts/qemu-tier/run.sh env)" && scripts/bench/real-libvirt.sh
#   scripts/qemu-tier/run.sh stop
#
# The build is the dev profile the tier's tests already compiled (the time is libvirtd's and
# QEMU's, not the provider's CPU); REAL_LIBVIRT_PROFILE=release measures a release build.
# Sizes and the KVM CPU model: see the header of tests/benches/real_libvirt.rs.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [[ -z ${BIGFLEET_QEMU_URI:-} ]]; then
    echo "real-libvirt bench: BIGFLEET_QEMU_* is not set; start the tier and load its exports first" \
        "(scripts/qemu-tier/run.sh env)" >&2
    exit 2
fi
# --workspace (not -p bigfleet-libvirt): features resolve as in scripts/test.sh's workspace
# build, which the dev profile then reuses instead of rebuilding every crate (65 s in CI).
cargo bench --locked --workspace --profile "${REAL_LIBVIRT_PROFILE:-dev}" --bench real_libvirt
