#!/usr/bin/env bash
# Installs the cargo tools of the supply-chain checks and the SBOM into a per-user cache
# outside the repository (~/.cache/bigfleet-libvirt/cargo-tools/bin), built from crates.io
# with `cargo install --locked` at pinned versions, so every clone on the machine (CI's among
# them) shares one build:
#
#   cargo-deny       advisories (offline, against a RustSec snapshot), licences, bans and
#                    sources of Cargo.lock (deny.toml; scripts/supply-chain.sh, run by .ci/run)
#   cargo-cyclonedx  the CycloneDX SBOM of the binary's crates (deploy/sbom.sh: the image
#                    build, and the SBOM test in tests/tests/image.rs)
#
# A tool already installed at its pinned version is left alone, so only a fresh machine pays
# the build. Each tool is compiled from source, without link-time optimisation: cargo-deny's
# own release profile asks for fat LTO with one codegen unit, a single-threaded optimisation
# of the whole program at the end of the build that makes the tool a little faster and the
# build longer (CARGO_PROFILE_RELEASE_* below override the crates' own profiles, as cargo's
# environment does; the code and the dependency versions are the same). Exits non-zero, naming the tool and the registry,
# when an install fails.
#
#   scripts/install-cargo-tools.sh            both
#   scripts/install-cargo-tools.sh NAME...    only those (e.g. cargo-cyclonedx)
#
# Environment: BIGFLEET_CARGO_TOOLS_DIR overrides the directory (default
# ${XDG_CACHE_HOME:-~/.cache}/bigfleet-libvirt/cargo-tools); the tools land in its bin/.
set -euo pipefail

# name version: bump a version here and the next run reinstalls that tool.
pins=(
    "cargo-deny 0.20.2"
    "cargo-cyclonedx 0.5.9"
)

cargo_root="${BIGFLEET_CARGO_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bigfleet-libvirt/cargo-tools}"

say() { echo "install-cargo-tools: $*" >&2; }
die() {
    say "ERROR: $*"
    exit 1
}

command -v cargo >/dev/null 2>&1 || die "cargo is not installed; install the Rust toolchain first"
mkdir -p "$cargo_root"

# One installer at a time (test runners may start several at once).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$cargo_root/.install.lock"
    flock 9
fi

wanted=("$@")
pinned_names=" ${pins[*]%% *} "
for w in "${wanted[@]}"; do
    [[ $pinned_names == *" $w "* ]] || die "unknown tool '$w': the pinned ones are${pinned_names% }"
done
selected() { # name
    ((${#wanted[@]} == 0)) && return 0
    local w
    for w in "${wanted[@]}"; do [[ $w == "$1" ]] && return 0; done
    return 1
}

# The version a tool binary reports, e.g. "cargo-deny 0.20.2" -> 0.20.2. Each of these
# tools is a cargo subcommand, so it takes its subcommand name as its first argument.
installed_version() { # name
    local bin="$cargo_root/bin/$1" sub=${1#cargo-}
    [[ -x $bin ]] || return 0
    "$bin" "$sub" --version 2>/dev/null | awk '{ print $NF }'
}

for pin in "${pins[@]}"; do
    read -r name version <<<"$pin"
    selected "$name" || continue
    have=$(installed_version "$name")
    if [[ $have == "$version" ]]; then
        say "$name: already installed ($version)"
        continue
    fi
    say "$name: building $version from crates.io (cargo install --locked; takes minutes on a fresh machine)"
    start=$SECONDS
    if ! CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
        cargo install --locked --quiet --root "$cargo_root" "$name@$version"; then
        die "cargo install --locked $name@$version failed: crates.io is unreachable, or the build failed (see above)"
    fi
    have=$(installed_version "$name")
    [[ $have == "$version" ]] || die "$name $version installed, but $cargo_root/bin/$name reports '${have:-nothing}'"
    say "$name: installed $version in $((SECONDS - start)) s at $cargo_root/bin/$name"
done
