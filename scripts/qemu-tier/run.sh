#!/usr/bin/env bash
# The real-QEMU test tier: three real libvirtd + QEMU hosts from one Debian 12 chroot, a tiny
# guest (Debian cloud kernel + busybox/qemu-ga initramfs) the provider can drive through the
# guest agent, and a real Debian 12 golden image (image.sh) for the image zone c, whose
# libvirtd runs in a network namespace with a NAT network (network.sh). The chroot is only
# built and never run in: each zone (a, b and c) is an overlayfs mount on top of it with its
# own upper layer, so the daemons share the packages and the guests but each has its own
# /etc/libvirt, /run, /var/lib/libvirt (pool and golden image) and /var/log. The chroot keeps the host untouched: installing Debian 12's
# qemu-system-x86 on the host would remove its newer qemu-utils (qemu-img 10.0.2, from
# bookworm-backports), which declares Breaks: qemu-system-common (<< 8.0).
#
#   scripts/qemu-tier/run.sh check     exit 0 if this machine can run the tier, else print
#                                      "qemu tier: skipped: <reason>" and exit 3
#   scripts/qemu-tier/run.sh prepare   build the chroot, the guest and the golden image (idempotent;
#                                      fast when done)
#   scripts/qemu-tier/run.sh prepare --background
#                                      the same in the background (log: $QEMU_TIER_DIR/prepare.log),
#                                      so it overlaps the cargo builds; `ci` waits for it. Does
#                                      nothing where the tier is skipped or one already runs
#   scripts/qemu-tier/run.sh start     mount the zones, start virtlogd + libvirtd in each, create
#                                      each zone's pool and golden image (zone c: in its network
#                                      namespace, with the network default, the real image, and
#                                      a KVM probe)
#   scripts/qemu-tier/run.sh env       print the BIGFLEET_QEMU_* export lines for the test
#   scripts/qemu-tier/run.sh stop      stop Ceph (as `ceph stop`), remove every domain, stop the
#                                      daemons, unmount
#   scripts/qemu-tier/run.sh ceph start
#                                      start a single-node Ceph cluster on 127.0.0.1 (ceph.sh; made
#                                      once in $QEMU_TIER_DIR/ceph, fast when made) and define the
#                                      rbd pool bigfleet-rbd and its secret in the started zones a, b
#   scripts/qemu-tier/run.sh ceph stop stop it (undefining those pools and secrets); keeps its data
#   scripts/qemu-tier/run.sh ceph env  print the BIGFLEET_QEMU_*RBD*/CEPH* export lines
#   scripts/qemu-tier/run.sh ceph cli rbd ls bigfleet
#                                      rbd, ceph, rados, ... in the cluster's chroot with its
#                                      ceph.conf as client.admin (no lock; stdin passes through)
#   scripts/qemu-tier/run.sh ci        check (skip = exit 0), prepare, start, ceph start, run the
#                                      qemu_e2e, qemu_faults, qemu_crash, qemu_slow, on_real_libvirtd
#                                      (the conformance behaviours), qemu_image, qemu_ceph,
#                                      qemu_lanes and
#                                      qemu_remote tests (tests/tests/), then the real-libvirt benchmark
#                                      (scripts/bench/real-libvirt.sh), always stop; exits with the
#                                      tests' status (else the bench's)
#   scripts/qemu-tier/run.sh libvirtd ZONE kill|term|start
#                                      SIGKILL / SIGTERM (waiting for it to exit) / start (waiting
#                                      until it answers) one zone's libvirtd; takes no lock, for
#                                      the fault tests while ci runs them
#   scripts/qemu-tier/run.sh virsh ... virsh against zone a's daemon (QEMU_TIER_ZONE=b or c: that
#                                      zone's)
#   scripts/qemu-tier/run.sh virt-admin ...
#                                      virt-admin against zone a's daemon's admin socket (the
#                                      same QEMU_TIER_ZONE), e.g. client-list libvirtd
#   scripts/qemu-tier/run.sh shell     a shell inside the chroot (mounts it first)
#
# Environment: QEMU_TIER_DIR (default /var/tmp/bigfleet-qemu-tier) holds the chroot in
# $QEMU_TIER_DIR/bookworm and the zones in $QEMU_TIER_DIR/zone-{a,b,c} (every socket, pid
# file, pool and log lives under it); QEMU_TIER_MIRROR overrides the Debian mirror debootstrap uses
# (default: the host's, from /etc/apt/sources.list.d/debian.sources). Needs root, x86_64,
# apt and the mirror (only while the chroot is built).
# Paths inside a zone (/guest/vmlinuz, the pool directory) are what its libvirtd sees; the
# tests talk to each daemon through its zone's socket from the host.
#
# This file holds the commands; its parts sit beside it and the guest's files: common.sh
# (settings and helpers), check.sh, chroot.sh (kernel mounts, processes, prepare), image.sh
# (the golden image; its files in image/), network.sh (zone c's namespace, network and KVM
# probe), zones.sh (start, stop, libvirtd, env), remote.sh, ceph.sh (the Ceph cluster) and
# ci.sh.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
# The guest's files (init, hooks, build script) and this script's parts.
guest_src=$repo/scripts/qemu-tier

# shellcheck source=scripts/qemu-tier/common.sh
source "$guest_src/common.sh"
# shellcheck source=scripts/qemu-tier/check.sh
source "$guest_src/check.sh"
# shellcheck source=scripts/qemu-tier/chroot.sh
source "$guest_src/chroot.sh"
# shellcheck source=scripts/qemu-tier/image.sh
source "$guest_src/image.sh"
# shellcheck source=scripts/qemu-tier/network.sh
source "$guest_src/network.sh"
# shellcheck source=scripts/qemu-tier/zones.sh
source "$guest_src/zones.sh"
# shellcheck source=scripts/qemu-tier/remote.sh
source "$guest_src/remote.sh"
# shellcheck source=scripts/qemu-tier/ceph.sh
source "$guest_src/ceph.sh"
# shellcheck source=scripts/qemu-tier/ci.sh
source "$guest_src/ci.sh"

# The header comment of this file.
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

case "${1:-}" in
check) cmd_check ;;
prepare)
    if [[ ${2:-} == --background ]]; then
        prepare_in_background
        exit 0
    fi
    lock
    # The mounts prepare needs are undone when it ends (even on failure), unless the tier
    # is running.
    trap 'tier_running || unmount_chroot' EXIT
    cmd_prepare
    ;;
start) lock && cmd_start ;;
stop) lock && cmd_stop ;;
env) cmd_env ;;
ceph)
    shift
    cmd_ceph "$@"
    ;;
ci) cmd_ci ;;
libvirtd)
    shift
    cmd_libvirtd "$@"
    ;;
virsh)
    shift
    zone=${QEMU_TIER_ZONE:-a}
    valid_zone "$zone"
    in_zone "$zone" chroot_pid libvirtd >/dev/null || die "zone $zone is not started; run: $0 start"
    in_zone "$zone" in_chroot virsh -c qemu:///system "$@"
    ;;
virt-admin)
    shift
    zone=${QEMU_TIER_ZONE:-a}
    valid_zone "$zone"
    in_zone "$zone" chroot_pid libvirtd >/dev/null || die "zone $zone is not started; run: $0 start"
    in_zone "$zone" in_chroot virt-admin -c libvirtd:///system "$@"
    ;;
shell)
    prepared || die "not prepared; run: $0 prepare"
    lock
    mount_chroot
    in_chroot TERM="${TERM:-dumb}" /bin/bash -l || true
    tier_running || unmount_chroot
    ;;
"" | -h | --help | help) usage ;;
*)
    usage >&2
    exit 2
    ;;
esac
