#!/usr/bin/env bash
# Assembles the container's runtime tree: the stripped binary plus exactly the shared objects
# it loads. deploy/Dockerfile runs this in its build stage, and the image test
# (tests/tests/image.rs) runs the same script on the CI machine, so what the test checks is
# what the image ships.
#
#   deploy/stage-runtime.sh BINARY STAGING [DEBUG_DIR]
#
# STAGING receives usr/local/bin/bigfleet-libvirt, stripped of all symbols and debug info, and
# every absolute path `ldd` reports (libraries and the ELF interpreter), copied with symlinks
# resolved to the same path under STAGING. With DEBUG_DIR, the debug info is kept there as
# bigfleet-libvirt.debug (the stripped binary carries a .gnu_debuglink to it), for symbolising
# backtraces outside the image. A library ldd cannot resolve fails the script. The last lines
# printed are the tree's files and sizes, then its total in bytes.
set -euo pipefail

if (($# < 2 || $# > 3)); then
    echo "usage: $0 BINARY STAGING [DEBUG_DIR]" >&2
    exit 2
fi
binary=$1 staging=$2 debug_dir=${3:-}
for tool in ldd objcopy readelf; do
    command -v "$tool" >/dev/null || {
        echo "$0: $tool is not installed (Debian: binutils, libc-bin)" >&2
        exit 1
    }
done
[[ -f $binary ]] || {
    echo "$0: $binary does not exist; build it first (cargo build --release --bin bigfleet-libvirt)" >&2
    exit 1
}

target="$staging/usr/local/bin/bigfleet-libvirt"
install -D -m 0755 "$binary" "$target"
if [[ -n $debug_dir ]]; then
    mkdir -p "$debug_dir"
    objcopy --only-keep-debug "$target" "$debug_dir/bigfleet-libvirt.debug"
    objcopy --strip-all --add-gnu-debuglink="$debug_dir/bigfleet-libvirt.debug" "$target"
else
    objcopy --strip-all "$target"
fi

ldd_out=$(ldd "$target")
if grep -q 'not found' <<<"$ldd_out"; then
    echo "$0: unresolved shared library:" >&2
    grep 'not found' <<<"$ldd_out" >&2
    exit 1
fi
awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$ldd_out" |
    sort -u |
    while read -r lib; do cp -L --parents "$lib" "$staging"; done

interp=$(readelf -l "$target" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
if [[ -z $interp || ! -f "$staging$interp" ]]; then
    echo "$0: the ELF interpreter ${interp:-?} was not staged" >&2
    exit 1
fi

find "$staging" -type f -printf '%P %s\n' | sort
echo "total $(find "$staging" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')"
