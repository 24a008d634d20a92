#!/usr/bin/env bash
# The supply-chain checks of Cargo.lock, offline (.ci/run runs them before the tests), all
# four by cargo-deny with deny.toml:
#
#   advisories  against a RustSec advisory-db snapshot: every advisory fails the check
#               (vulnerabilities, and unmaintained, unsound or yanked crates) unless deny.toml
#               ignores its id with a reason; the ignored ids are printed with their reasons
#   licences    an allow-list of permissive licences (two LGPL exceptions, named)
#   bans        duplicate versions reported, wildcard requirements refused
#   sources     crates.io only
#
#   scripts/supply-chain.sh ADVISORY_DB
#
# ADVISORY_DB is a copy of the RustSec advisory-db (CI: shared/advisory-db beside the
# repository; a git clone works too). The database is never fetched: a missing snapshot fails
# with the path it looked at. cargo-deny reads a database only as a clone it manages (a
# directory named after the database's URL under its db-path, with a .git/FETCH_HEAD whose
# time is the last fetch), so the advisories are copied into a scratch db-path laid out that
# way, with the snapshot's own date (its newest advisory's) as the fetch time: cargo-deny
# refuses a database older than deny.toml's maximum-db-staleness (a year). Crate sources are fetched (cargo fetch --locked)
# because cargo-deny reads them. cargo-deny comes from scripts/install-cargo-tools.sh
# (installed when missing).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

say() { echo "supply-chain: $*" >&2; }
die() {
    say "ERROR: $*"
    exit 1
}

(($# == 1)) || die "usage: $0 ADVISORY_DB (a RustSec advisory-db copy, e.g. the shared/advisory-db folder beside the repository)"
db=$1
[[ -d $db/crates ]] || die "no RustSec advisory database at $db (expected its crates/ folder): pass the snapshot's path (CI: shared/advisory-db beside the repository)"
db="$(cd "$db" && pwd)"

scripts/install-cargo-tools.sh cargo-deny
deny="${BIGFLEET_CARGO_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bigfleet-libvirt/cargo-tools}/bin/cargo-deny"

# Every ignored advisory needs its reason: deny.toml lists each as
# { id = "RUSTSEC-...", reason = "..." } on one line, its longer story in comments above.
config=deny.toml
if ! reasons=$(awk '
    /^\[/ { section = $0; inside = 0 }
    section == "[advisories]" && /^[[:space:]]*ignore[[:space:]]*=/ { inside = 1; next }
    inside && /^[[:space:]]*\]/ { inside = 0 }
    inside && /RUSTSEC-[0-9]+-[0-9]+/ {
        match($0, /RUSTSEC-[0-9]+-[0-9]+/); id = substr($0, RSTART, RLENGTH)
        if (!match($0, /reason[[:space:]]*=[[:space:]]*"[^"]+"/)) {
            print "no reason for " id > "/dev/stderr"; bad = 1; next
        }
        reason = substr($0, RSTART, RLENGTH); sub(/^reason[[:space:]]*=[[:space:]]*"/, "", reason)
        print id ": " substr(reason, 1, length(reason) - 1)
    }
    END { exit bad }' "$config"); then
    die "every id in [advisories] ignore of $config needs its reason: { id = \"RUSTSEC-...\", reason = \"why\" } on one line"
fi
if [[ -n $reasons ]]; then
    say "advisories ignored in $config, with their reasons:"
    while read -r line; do say "  $line"; done <<<"$reasons"
fi

# The scratch db-path deny.toml names through BIGFLEET_ADVISORY_DBS. The directory is the one
# cargo-deny 0.20 derives from deny.toml's db-urls entry (the URL's last path segment and an
# XxHash64 of the lower-cased URL): a cargo-deny that names it otherwise fails on the missing
# .git/FETCH_HEAD, and `cargo-deny -L debug --offline check advisories` prints the name it
# expects ("Opening advisory database at ...").
dbs=$(mktemp -d)
trap 'rm -rf "$dbs"' EXIT
clone="$dbs/advisory-db-3157b0e258782691"
mkdir -p "$clone/.git"
cp -R "$db/crates" "$clone/crates"
count=$(find "$clone/crates" -name 'RUSTSEC-*.md' | wc -l)
((count > 0)) || die "$db/crates holds no RUSTSEC-*.md advisory: not a RustSec advisory database"
# The snapshot's age is the date of its newest advisory (its content), not its files' times,
# which a copy may or may not keep: cargo-deny reads the age from FETCH_HEAD's time and
# refuses a database older than deny.toml's maximum-db-staleness.
newest=$(grep -h '^date = "' "$db"/crates/*/RUSTSEC-*.md | sort | tail -n 1 | cut -d'"' -f2)
[[ $newest =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]] \
    || die "cannot read the newest advisory's date in $db/crates (found \"$newest\")"
: >"$clone/.git/FETCH_HEAD"
touch -d "$newest 00:00 UTC" "$clone/.git/FETCH_HEAD"
say "advisory database: $count advisories from $db (the newest dated $newest)"

# cargo-deny reads `cargo metadata` for every target, so it needs the sources of crates that no
# build on this machine downloads (e.g. android_system_properties): fetch them first, checked
# against Cargo.lock's checksums. A no-op when the registry cache already has them all.
say "cargo fetch --locked (every crate in Cargo.lock, for every target)"
cargo fetch --locked \
    || die "cargo fetch failed (above): cargo-deny needs every crate of Cargo.lock in the local registry; check the network to crates.io or run 'cargo fetch --locked' where it works"

say "cargo deny --offline --locked check advisories licenses bans sources"
BIGFLEET_ADVISORY_DBS=$dbs "$deny" --offline --locked check advisories licenses bans sources \
    || die "cargo deny failed (above). An advisory: update the crate (cargo update -p NAME), or ignore its id in $config with the reason. \"repository is stale\": the snapshot's newest advisory is older than maximum-db-staleness in $config; refresh $db. A licence, a ban or a source: see the allow-lists in $config"
say "ok"
