#!/usr/bin/env bash
# Writes the image's SBOM: one CycloneDX JSON document naming the Rust crates compiled into
# the binary and the Debian packages of the staged runtime tree. deploy/Dockerfile runs it
# after deploy/stage-runtime.sh, and the image test (tests/tests/image.rs) runs the same
# script on the tree it stages.
#
#   deploy/sbom.sh STAGING OUTPUT
#
# The crates come from cargo-cyclonedx, run on the bigfleet-libvirt package with its default
# features (what `cargo build --release --bin bigfleet-libvirt` compiles) for the host target:
# the binary's normal dependencies, not its dev-dependencies nor other platforms' crates. The
# Debian packages come from the records stage-runtime.sh wrote in
# STAGING/var/lib/dpkg/status.d, each with a pkg:deb purl for the Debian release of this
# machine (/etc/os-release). cargo-cyclonedx is the one scripts/install-cargo-tools.sh pins
# (in $BIGFLEET_CARGO_TOOLS_DIR/bin, default ~/.cache/bigfleet-libvirt/cargo-tools/bin); jq
# merges the two.
set -euo pipefail

if (($# != 2)); then
    echo "usage: $0 STAGING OUTPUT" >&2
    exit 2
fi
staging=$1 output=$2
root="$(cd "$(dirname "$0")/.." && pwd)"
cyclonedx="${BIGFLEET_CARGO_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bigfleet-libvirt/cargo-tools}/bin/cargo-cyclonedx"

die() {
    echo "$0: $*" >&2
    exit 1
}
[[ -x $cyclonedx ]] || die "$cyclonedx is not installed; run scripts/install-cargo-tools.sh cargo-cyclonedx"
command -v jq >/dev/null || die "jq is not installed (Debian: jq)"
records="$staging/var/lib/dpkg/status.d"
[[ -d $records ]] || die "$records does not exist; stage the tree with deploy/stage-runtime.sh first"
[[ -r /etc/os-release ]] || die "/etc/os-release is missing: the Debian release of the packages is unknown"
# shellcheck source=/dev/null
distro=$(. /etc/os-release && echo "${ID:?}-${VERSION_ID:?}")
host=$(rustc -vV | sed -n 's/^host: //p')
[[ -n $host ]] || die "rustc -vV printed no host target"

# cargo-cyclonedx writes one file beside the manifest of every workspace member, under a name
# of this run's own: the binary's is moved out, and all of them are removed on exit.
bom_name="bigfleet-libvirt-sbom-$$"
work=$(mktemp -d)
cleanup() {
    rm -rf "$work"
    find "$root" -path "$root/target" -prune -o -path "$root/.tools" -prune -o \
        -name "$bom_name.json" -type f -exec rm -f {} +
}
trap cleanup EXIT

"$cyclonedx" cyclonedx --manifest-path "$root/infra/bin/Cargo.toml" --format json \
    --spec-version 1.5 --target "$host" --no-build-deps --override-filename "$bom_name" --quiet \
    || die "cargo-cyclonedx failed (above)"
mv "$root/infra/bin/$bom_name.json" "$work/crates.json"

# One CycloneDX component per package record (the .md5sums files are file lists).
debs="$work/debs.json"
echo '[]' >"$debs"
field() { sed -n "s/^$2: //p" "$1" | head -n 1; } # record name
for record in "$records"/*; do
    [[ $record == *.md5sums ]] && continue
    name=$(field "$record" Package) version=$(field "$record" Version)
    arch=$(field "$record" Architecture) source=$(field "$record" Source)
    [[ -n $name && -n $version && -n $arch ]] || die "$record lacks Package, Version or Architecture"
    # Source may carry its own version, "glibc (2.36-9)"; the purl names the source package.
    source=${source%% *}
    jq --arg name "$name" --arg version "$version" --arg arch "$arch" \
        --arg source "${source:-$name}" --arg distro "$distro" '
        ($version | capture("^(?:(?<epoch>[0-9]+):)?(?<rest>.*)$")) as $v
        | . + [{
            type: "library",
            "bom-ref": "pkg:deb/debian/\($name)@\($version)?arch=\($arch)",
            name: $name,
            version: $version,
            purl: ("pkg:deb/debian/\($name)@\($v.rest | @uri)?arch=\($arch)&distro=\($distro)"
                + (if $v.epoch then "&epoch=\($v.epoch)" else "" end)
                + (if $source != $name then "&upstream=\($source | @uri)" else "" end)),
            properties: [{name: "debian:source", value: $source}]
        }]' "$debs" >"$debs.new"
    mv "$debs.new" "$debs"
done
[[ $(jq length "$debs") -gt 0 ]] || die "$records holds no package record"

mkdir -p "$(dirname "$output")"
jq --slurpfile debs "$debs" '.components = ((.components // []) + $debs[0])' \
    "$work/crates.json" >"$output"
echo "$output: $(jq '[.components[] | select(.purl | startswith("pkg:cargo/"))] | length' "$output") crates, $(jq length "$debs") Debian packages"
