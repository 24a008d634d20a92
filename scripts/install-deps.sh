#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need. Safe to run repeatedly; run as
# root (or with sudo) on Debian 12. Installs nothing when everything is already present.
set -euo pipefail

# prometheus: promtool and the server, for the alert-rule and live-scrape tests (tests/tests/observe*.rs);
# and the shellcheck package, for the tidy test that checks every shell script (tests/tests/tidy/shell.rs).
packages=(pkg-config libvirt-dev openssl binutils prometheus shellcheck)

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
    exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "installing: ${missing[*]}" >&2
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
