#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need. Safe to run repeatedly; run as
# root (or with sudo) on Debian 12. Installs nothing when everything is already present.
#
# The cargo tools (scripts/install-cargo-tools.sh, built from source: minutes on a fresh
# machine) are not installed here, so running the provider needs none of them: each is
# installed where it is used. scripts/supply-chain.sh installs cargo-deny; scripts/test.sh
# installs cargo-cyclonedx for the SBOM test, as that test does itself when it is missing, and
# as the image build does.
set -euo pipefail
cd "$(dirname "$0")/.."

# prometheus: promtool and the server, for the alert-rule and live-scrape tests (tests/tests/observe*.rs);
# the shellcheck package, for the tidy test that checks every shell script (tests/tests/tidy/shell.rs);
# jq, with which deploy/sbom.sh adds the image's Debian packages to the SBOM (tests/tests/image.rs);
# libvirt-daemon (without its recommends: no QEMU on the host), for the tests that stop and
# resume a private libvirtd serving libvirt's test driver on its own socket (host isolation);
# faketime (libfaketime), for the test that steps the wall clock under the binary; and python3,
# which runs scripts/timing-headroom.py in its own test (tests/tests/harness/timing.rs).
packages=(pkg-config libvirt-dev openssl binutils prometheus shellcheck jq libvirt-daemon faketime python3)

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
