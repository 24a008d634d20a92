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
# backtraces outside the image. A library ldd cannot resolve fails the script.
#
# For image scanners (Trivy, Grype), STAGING also receives the record of every Debian package a
# staged file comes from, the way distroless images carry theirs:
# var/lib/dpkg/status.d/<package> (the package's stanza as `dpkg-query -s` prints it) and
# var/lib/dpkg/status.d/<package>.md5sums (the package's file list with checksums). A staged
# file that no installed package owns fails the script. The last lines printed are the tree's
# files and sizes, then its total in bytes.
set -euo pipefail

if (($# < 2 || $# > 3)); then
    echo "usage: $0 BINARY STAGING [DEBUG_DIR]" >&2
    exit 2
fi
binary=$1 staging=$2 debug_dir=${3:-}
for tool in ldd objcopy readelf dpkg-query; do
    command -v "$tool" >/dev/null || {
        echo "$0: $tool is not installed (Debian: binutils, libc-bin, dpkg)" >&2
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
mapfile -t libs < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$ldd_out" | sort -u)
for lib in "${libs[@]}"; do cp -L --parents "$lib" "$staging"; done

interp=$(readelf -l "$target" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
if [[ -z $interp || ! -f "$staging$interp" ]]; then
    echo "$0: the ELF interpreter ${interp:-?} was not staged" >&2
    exit 1
fi

# The package that owns a staged path. dpkg knows each file by the path its package installs
# it at, which may be the other side of the merged /usr (ldd says /lib/..., the package ships
# /usr/lib/...) or the file a symlink resolves to, so each of those is asked in turn.
owner() { # path
    local path=$1 real candidates=() candidate out
    real=$(readlink -f "$path")
    for candidate in "$path" "$real"; do
        candidates+=("$candidate")
        case $candidate in
            /usr/*) candidates+=("${candidate#/usr}") ;;
            *) candidates+=("/usr$candidate") ;;
        esac
    done
    for candidate in "${candidates[@]}"; do
        # "pkg:arch[, pkg2:arch]: /path"; "diversion by ..." lines are not owners.
        if out=$(dpkg-query -S "$candidate" 2>/dev/null); then
            out=$(grep -v '^diversion ' <<<"$out" | head -n 1)
            if [[ -n $out ]]; then
                echo "${out%%: *}" | tr ',' '\n' | tr -d ' '
                return 0
            fi
        fi
    done
    return 1
}

records="$staging/var/lib/dpkg/status.d"
mkdir -p "$records"
declare -A packages=()
for lib in "${libs[@]}"; do
    if ! owned=$(owner "$lib"); then
        echo "$0: no installed Debian package owns $lib (dpkg-query -S), so an image scanner could not see it; install it from a Debian package" >&2
        exit 1
    fi
    while read -r package; do packages[$package]=1; done <<<"$owned"
done
for package in "${!packages[@]}"; do
    name=${package%%:*}
    dpkg-query -s "$package" >"$records/$name"
    md5sums=$(dpkg-query --control-path "$package" md5sums)
    [[ -f $md5sums ]] || {
        echo "$0: package $package has no md5sums file, which scanners use to tie files to it" >&2
        exit 1
    }
    cp "$md5sums" "$records/$name.md5sums"
done

find "$staging" -type f -printf '%P %s\n' | sort
echo "total $(find "$staging" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')"
