#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, then the cargo tools of the
# supply-chain checks and the SBOM (scripts/install-cargo-tools.sh: cargo-audit, cargo-deny,
# cargo-cyclonedx, built from crates.io at pinned versions). Safe to run repeatedly; run as
# root (or with sudo) on Debian 12. Installs nothing when everything is already present.
#
#   scripts/install-deps.sh              both
#   scripts/install-deps.sh --packages   only the Debian packages (CI starts the tier's
#                                        background prepare before the cargo tools build)
set -euo pipefail
cd "$(dirname "$0")/.."

# prometheus: promtool and the server, for the alert-rule and live-scrape tests (tests/tests/observe*.rs);
# the shellcheck package, for the tidy test that checks every shell script (tests/tests/tidy/shell.rs);
# jq, with which deploy/sbom.sh adds the image's Debian packages to the SBOM (tests/tests/image.rs).
packages=(pkg-config libvirt-dev openssl binutils prometheus shellcheck jq)

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$package")
done
if ((${#missing[@]} > 0)); then
    sudo=""
    if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
    echo "installing: ${missing[*]}" >&2
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

if [[ ${1:-} == --packages ]]; then
    exit 0
fi
scripts/install-cargo-tools.sh
