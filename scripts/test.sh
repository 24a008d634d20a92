#!/usr/bin/env bash
# Runs the whole test suite: installs what the build needs, builds the binary the black-box
# tests spawn, then runs every unit, property, snapshot and integration test.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cargo build --locked --workspace --bins
cargo test --locked --workspace
