#!/usr/bin/env bash
# The supply-chain checks of Cargo.lock, offline (.ci/run runs them before the tests):
#
#   1. advisories: cargo-audit against a RustSec advisory-db snapshot, with the policy and the
#      ignored ids (each with its reason) in .cargo/audit.toml; the ignored ids are printed.
#   2. licences, bans and sources: cargo-deny with deny.toml (a licence allow-list, a
#      duplicate-version report, crates.io as the only source).
#
#   scripts/supply-chain.sh ADVISORY_DB
#
# ADVISORY_DB is a checkout of the RustSec advisory-db (CI: shared/advisory-db beside the
# repository). The advisory database is never fetched: a missing snapshot fails with the path it
# looked at. Crate sources are fetched (cargo fetch --locked) because cargo-deny reads them. The
# tools come from scripts/install-cargo-tools.sh (installed when missing).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

say() { echo "supply-chain: $*" >&2; }
die() {
    say "ERROR: $*"
    exit 1
}

(($# == 1)) || die "usage: $0 ADVISORY_DB (a RustSec advisory-db checkout, e.g. the shared/advisory-db folder beside the repository)"
db=$1
[[ -d $db/crates ]] || die "no RustSec advisory database at $db (expected its crates/ folder): pass the snapshot's path (CI: shared/advisory-db beside the repository)"
db="$(cd "$db" && pwd)"

scripts/install-cargo-tools.sh cargo-audit cargo-deny
bin="${BIGFLEET_CARGO_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bigfleet-libvirt/cargo-tools}/bin"

# Every ignored advisory needs its reason: a comment on the line right above its id.
config=.cargo/audit.toml
[[ -f $config ]] || die "$config is missing (cargo-audit's policy and ignore list)"
if ! reasons=$(awk '
    /^[[:space:]]*ignore[[:space:]]*=/ { inside = 1; next }
    inside && /^[[:space:]]*\]/ { inside = 0 }
    inside && /^[[:space:]]*#/ { sub(/^[[:space:]]*#[[:space:]]*/, ""); reason = reason (reason ? " " : "") $0; next }
    inside && /"RUSTSEC-[0-9]+-[0-9]+"/ {
        match($0, /RUSTSEC-[0-9]+-[0-9]+/); id = substr($0, RSTART, RLENGTH)
        if (reason == "") { print "no reason above " id > "/dev/stderr"; bad = 1 }
        print id ": " reason; reason = ""
    }
    END { exit bad }' "$config"); then
    die "every id in the ignore list of $config needs a comment above it saying why"
fi
if [[ -n $reasons ]]; then
    say "advisories ignored in $config, with their reasons:"
    while read -r line; do say "  $line"; done <<<"$reasons"
fi

say "cargo audit --db $db --no-fetch"
"$bin/cargo-audit" audit --db "$db" --no-fetch --file Cargo.lock \
    || die "cargo audit found advisories (above): update the crate (cargo update -p NAME), or ignore the id in $config with the reason in a comment above it"

# cargo-deny reads `cargo metadata` for every target, so it needs the sources of crates that no
# build on this machine downloads (e.g. android_system_properties): fetch them first, checked
# against Cargo.lock's checksums. A no-op when the registry cache already has them all.
say "cargo fetch --locked (every crate in Cargo.lock, for every target)"
cargo fetch --locked \
    || die "cargo fetch failed (above): cargo-deny needs every crate of Cargo.lock in the local registry; check the network to crates.io or run 'cargo fetch --locked' where it works"

say "cargo deny --offline check licenses bans sources"
"$bin/cargo-deny" --offline --locked check licenses bans sources \
    || die "cargo deny failed (above): see deny.toml for the allowed licences and sources"
say "ok"
