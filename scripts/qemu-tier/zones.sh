#!/usr/bin/env bash
# The real-QEMU tier: `start`, `stop`, `libvirtd` and `env`: mounting the two zones, their
# daemons, pools and golden images, and the exports the tests read.
# Sourced by scripts/qemu-tier/run.sh (not run on its own), after common.sh.
# shellcheck disable=SC2154 # the lowercase settings (tier_dir, pool, ...) are set in common.sh

# Mounts zone $1 (an overlay of the chroot) unless it is mounted. Its upper layer is thrown
# away when the chroot was rebuilt since it was made (an overlay on a changed lower layer
# is not coherent).
mount_zone() {
    local dir root stamp
    dir=$(zone_dir "$1")
    root=$(zone_root "$1")
    mountpoint -q "$root" && return 0
    stamp="$(base_stamp) $(guest_stamp) $(image_stamp)"
    if [[ ! -f $dir/.stamp || $(cat "$dir/.stamp") != "$stamp" ]]; then
        rm -rf --one-file-system "$dir/upper" "$dir/work"
    fi
    mkdir -p "$dir/upper" "$dir/work" "$root"
    mount -t overlay "bigfleet-zone-$1" -o "lowerdir=$R,upperdir=$dir/upper,workdir=$dir/work" "$root" \
        || die "cannot mount zone $1's overlay on $root"
    echo "$stamp" >"$dir/.stamp"
}

# libvirtd's limits, written explicitly into every zone's libvirtd.conf at each start. They
# are libvirt's own defaults, which the provider's per-host budget has to respect and the
# host_lanes test and the real-libvirt benchmark run against: at most 5 calls in flight per
# client connection (the daemon stops reading a client's socket beyond that), 20 worker
# threads, and keepalive as shipped (a ping every 5 s; 5 unanswered drop the client).
daemon_limits=('max_client_requests = 5' 'max_workers = 20' 'keepalive_interval = 5'
    'keepalive_count = 5')
set_daemon_limits() {
    local conf=$R/etc/libvirt/libvirtd.conf
    [[ -f $conf ]] || die "no $conf (run: $0 prepare)"
    sed -i -E '/^(max_client_requests|max_workers|keepalive_interval|keepalive_count) /d' "$conf"
    printf '%s\n' "${daemon_limits[@]}" >>"$conf"
}

# Starts virtlogd and libvirtd in the zone at $R (no waiting). The daemons daemonize
# themselves and write pid files (no init system in the chroot).
launch_daemons() {
    mount_chroot
    mkdir -p "$R/var/log/libvirt" "$R/run/libvirt" "$R$pool_dir"
    if ! chroot_pid virtlogd >/dev/null; then
        rm -f "$R/run/virtlogd.pid"
        in_chroot virtlogd -d -p /run/virtlogd.pid 9>&-
    fi
    launch_libvirtd
}

# SYSTEMD_DEVICE_VERIFY_SYSFS=0: libudev takes a device directory outside sysfs (the
# phantom device below); every real device is on sysfs and read as before.
launch_libvirtd() {
    if ! chroot_pid libvirtd >/dev/null; then
        rm -f "$R/run/libvirtd.pid"
        local listen=()
        listens_tls && listen=(--listen)
        in_chroot env SYSTEMD_DEVICE_VERIFY_SYSFS=0 libvirtd -d "${listen[@]}" -p /run/libvirtd.pid 9>&-
    fi
}

# Waits until the libvirtd at $R answers (its first start probes QEMU's capabilities).
await_libvirtd() {
    local waited=0
    until daemon_answers; do
        ((waited < 120)) || die "libvirtd in $R does not answer after 60s (log: $R/var/log/libvirt/libvirtd.log)"
        chroot_pid libvirtd >/dev/null || die "libvirtd in $R exited (log: $R/var/log/libvirt/libvirtd.log)"
        sleep 0.5
        ((waited += 1))
    done
}

# The storage pool and the golden image the provider's overlays are backed by, at $R.
ensure_pool() {
    if ! virsh_ pool-info "$pool" >/dev/null 2>&1; then
        virsh_ pool-define-as "$pool" dir --target "$pool_dir" >/dev/null
    fi
    local info
    info=$(virsh_ pool-info "$pool")
    if ! grep -Eq '^State:[[:space:]]+running' <<<"$info"; then
        virsh_ pool-start "$pool" >/dev/null
    fi
    virsh_ pool-refresh "$pool" >/dev/null
    if ! virsh_ vol-info --pool "$pool" "$image" >/dev/null 2>&1; then
        virsh_ vol-create-as "$pool" "$image" "$image_size" --format qcow2 >/dev/null
    fi
}

# Huge pages for the placement scenario (qemu_e2e::placement): 2 MiB pages reserved on this
# host while the tier runs (what the host had is kept in $tier_dir/hugepages.before and put
# back at stop), and hugetlbfs mounted in every zone before its libvirtd starts (libvirt
# finds the mount in its /proc/mounts then). The mount is the zone's own: $R/dev is a slave
# of the host's /dev, so nothing propagates back.
tier_hugepages=256
reserve_hugepages() {
    local have
    have=$(cat /proc/sys/vm/nr_hugepages)
    ((have >= tier_hugepages)) && return 0
    [[ -f $tier_dir/hugepages.before ]] || echo "$have" >"$tier_dir/hugepages.before"
    echo "$tier_hugepages" >/proc/sys/vm/nr_hugepages \
        || die "cannot reserve $tier_hugepages huge pages of 2 MiB (/proc/sys/vm/nr_hugepages)"
    say "huge pages: $(cat /proc/sys/vm/nr_hugepages) of 2 MiB reserved (were $have)"
}
mount_hugetlbfs() {
    mkdir -p "$R/dev/hugepages"
    mountpoint -q "$R/dev/hugepages" || mount -t hugetlbfs -o pagesize=2M hugetlbfs "$R/dev/hugepages"
}
release_hugepages() {
    [[ -f $tier_dir/hugepages.before ]] || return 0
    cat "$tier_dir/hugepages.before" >/proc/sys/vm/nr_hugepages
    say "huge pages: back to $(cat /proc/sys/vm/nr_hugepages)"
    rm -f "$tier_dir/hugepages.before"
}

# A PCI device that is not there, for qemu_e2e::passthrough: zone $phantom_zone's libvirtd
# lists an A100 (10de:20b0) at $phantom_address in IOMMU group $phantom_group, bound to no
# driver, with no hardware behind it. The zone's /sys/bus/pci/devices becomes a tmpfs with
# the host's entries (the same relative links into /sys/devices) plus a directory with the
# attributes libvirt reads (uevent, vendor, device, class, config space, the group link).
# The mount is the zone's own ($R/sys is a slave bind), so the host's sysfs is not changed.
# Without an IOMMU (the machines this runs on) libvirt refuses any PCI passthrough before it
# touches a device; with one, its attempt to bind the phantom to vfio-pci writes into the
# phantom's own directory and asks the kernel to probe an address that does not exist.
# It must be in place before the zone's libvirtd starts (libvirt enumerates devices once).
phantom_zone=a
phantom_address=0000:ff:00.0
phantom_group=4077
plant_phantom_device() {
    local devices=$R/sys/bus/pci/devices group=$R/run/bigfleet-phantom/iommu_groups/$phantom_group
    mountpoint -q "$devices" && return 0
    local entries=() entry
    for entry in /sys/bus/pci/devices/*; do
        [[ -e $entry ]] && entries+=("$(basename "$entry")" "$(readlink "$entry")")
    done
    mount -t tmpfs -o mode=755,size=1m bigfleet-phantom-pci "$devices" \
        || die "cannot mount a tmpfs on $devices (the phantom device)"
    local i
    for ((i = 0; i < ${#entries[@]}; i += 2)); do
        ln -s "${entries[i + 1]}" "$devices/${entries[i]}"
    done
    local dir=$devices/$phantom_address
    mkdir "$dir"
    printf '0x10de\n' >"$dir/vendor"
    printf '0x20b0\n' >"$dir/device"
    printf '0x030200\n' >"$dir/class"
    printf -- '-1\n' >"$dir/numa_node"
    printf 'PCI_CLASS=30200\nPCI_ID=10DE:20B0\nPCI_SLOT_NAME=%s\n' "$phantom_address" >"$dir/uevent"
    # Config space: vendor and device ids, class 03:02 (3D controller), header type 0, no
    # capability list; the rest zero.
    {
        printf '\xde\x10\xb0\x20\x00\x00\x00\x00\xa1\x00\x02\x03\x00\x00\x00\x00'
        head -c 240 /dev/zero
    } >"$dir/config"
    ln -s /sys/bus/pci "$dir/subsystem"
    mkdir -p "$group/devices"
    ln -sfn "/sys/bus/pci/devices/$phantom_address" "$group/devices/$phantom_address"
    ln -s "/run/bigfleet-phantom/iommu_groups/$phantom_group" "$dir/iommu_group"
}

cmd_start() {
    local started=$SECONDS z
    prepared || die "not prepared; run: $0 prepare"
    ensure_netns
    reserve_hugepages
    # The daemons probe QEMU at once, then each gets its pool (and zone c its network and
    # the real golden image).
    for z in "${zones[@]}"; do
        mount_zone "$z"
        in_zone "$z" mount_chroot
        in_zone "$z" mount_hugetlbfs
        [[ $z != "$phantom_zone" ]] || in_zone "$z" plant_phantom_device
        in_zone "$z" setup_remote_zone "$z"
        in_zone "$z" set_daemon_limits
        in_zone "$z" launch_daemons
    done
    for z in "${zones[@]}"; do
        in_zone "$z" await_libvirtd
        in_zone "$z" ensure_pool
        if [[ $z == "$image_zone" ]]; then
            in_zone "$z" ensure_network
            in_zone "$z" ensure_real_image
            in_zone "$z" cached_kvm_probe
            say "zone $z: KVM: $(cat "$(zone_dir "$z")/kvm")"
        fi
        say "zone $z: libvirtd pid $(in_zone "$z" chroot_pid libvirtd), virtlogd pid $(in_zone "$z" chroot_pid virtlogd)"
    done
    say "started zones ${zones[*]} with pool $pool and image $image ($((SECONDS - started))s)"
}

# Removes every domain and every volume but the golden image at $R, stops its daemons and
# whatever else runs there, and undoes its mounts.
stop_root() {
    if chroot_pid libvirtd >/dev/null && daemon_answers; then
        local domain volume
        while read -r domain; do
            [[ -n $domain ]] || continue
            virsh_ destroy "$domain" >/dev/null 2>&1 || true
            virsh_ undefine --managed-save --snapshots-metadata --nvram "$domain" >/dev/null 2>&1 \
                || virsh_ undefine "$domain" >/dev/null 2>&1 || true
            say "removed domain $domain"
        done < <(virsh_ list --all --name 2>/dev/null)
        if virsh_ pool-refresh "$pool" >/dev/null 2>&1; then
            while read -r volume _; do
                [[ -n $volume && $volume != "$image" && $volume != "$real_image" ]] || continue
                virsh_ vol-delete --pool "$pool" "$volume" >/dev/null 2>&1 || true
            done < <(virsh_ vol-list "$pool" 2>/dev/null)
        fi
    fi
    # The daemons, by the PIDs in their pid files.
    local pid
    if pid=$(chroot_pid libvirtd); then terminate 15 "$pid"; fi
    if pid=$(chroot_pid virtlogd); then terminate 10 "$pid"; fi
    rm -f "$R/run/libvirtd.pid" "$R/run/virtlogd.pid" "$R/run/sshd.pid" "$R/run/polkitd.pid" \
        "$R/run/dbus-daemon.pid"
    # Anything else still running inside (a QEMU orphaned by a killed daemon).
    local left
    mapfile -t left < <(chroot_pids)
    if ((${#left[@]} > 0)); then
        say "stopping leftover processes in $R: ${left[*]}"
        terminate 10 "${left[@]}"
    fi
    unmount_chroot
}

# Undoes each zone's mounts (its kernel filesystems, then the overlay itself).
unmount_zones() {
    local z root
    for z in "${zones[@]}"; do
        root=$(zone_root "$z")
        mountpoint -q "$root" || continue
        in_zone "$z" unmount_chroot
        umount "$root" 2>/dev/null || umount -l "$root"
    done
}

cmd_stop() {
    [[ -d $R ]] || return 0
    # Ceph first: it undefines its pools and secrets in the zones while they still run.
    cmd_ceph_stop
    # The zones at once: each waits seconds for its own daemons to exit (libvirtd ~3 s on
    # SIGTERM), and they share nothing (one after another this took 16 s of the tier's stop).
    local z pids=() status=0 pid
    for z in "${zones[@]}"; do
        mountpoint -q "$(zone_root "$z")" || continue
        in_zone "$z" stop_root &
        pids+=("$!")
    done
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    ((status == 0)) || die "stopping a zone failed (exit status $status); see above"
    unmount_zones
    release_hugepages
    remove_netns
    # The chroot itself: mounts left by prepare (and daemons of an older, single-zone tier).
    stop_root
    say "stopped"
}

# `libvirtd ZONE kill|term|start`: fault injection for the tests. No lock (ci holds it
# while the tests run); the zone must be mounted (the tier started).
cmd_libvirtd() {
    local z=${1:-} action=${2:-} pid
    valid_zone "$z"
    mountpoint -q "$(zone_root "$z")" || die "zone $z is not mounted; run: $0 start"
    case $action in
    kill)
        pid=$(in_zone "$z" chroot_pid libvirtd) || die "zone $z's libvirtd is not running"
        kill -KILL "$pid"
        while [[ -d /proc/$pid ]]; do sleep 0.05; done
        ;;
    term)
        pid=$(in_zone "$z" chroot_pid libvirtd) || die "zone $z's libvirtd is not running"
        in_zone "$z" terminate 15 "$pid"
        ;;
    start)
        in_zone "$z" launch_libvirtd
        in_zone "$z" await_libvirtd
        ;;
    *) die "usage: $0 libvirtd ZONE kill|term|start" ;;
    esac
}

cmd_env() {
    local z root upper
    for z in "${zones[@]}"; do
        root=$(zone_root "$z")
        # Zone a keeps the unsuffixed names (the single-host tests use it).
        upper=${z^^}
        [[ $z == a ]] && upper=
        echo "export BIGFLEET_QEMU_URI${upper:+_$upper}='qemu+unix:///system?socket=$root/run/libvirt/libvirt-sock'"
        # Where that libvirtd's file system is on the host (the tests read golden images there).
        echo "export BIGFLEET_QEMU_ROOT${upper:+_$upper}='$root'"
    done
    echo "export BIGFLEET_QEMU_POOL='$pool'"
    echo "export BIGFLEET_QEMU_IMAGE='$image'"
    echo "export BIGFLEET_QEMU_KERNEL='$kernel'"
    echo "export BIGFLEET_QEMU_INITRD='$initrd'"
    echo "export BIGFLEET_QEMU_CMDLINE='$cmdline'"
    # The fault tests stop and start daemons through this script, in this tier.
    # The image zone: the real golden image, and whether its QEMU can use KVM.
    echo "export BIGFLEET_QEMU_REAL_IMAGE='$real_image'"
    echo "export BIGFLEET_QEMU_PHANTOM_PCI='$phantom_address'"
    echo "export BIGFLEET_QEMU_KVM='$(cat "$(zone_dir "$image_zone")/kvm" 2>/dev/null || echo "no: the tier is not started")'"
    # The image zone's network namespace (the static address test pings its guest from it).
    echo "export BIGFLEET_QEMU_NETNS='$(netns_name)'"
    echo "export BIGFLEET_QEMU_TIER_SCRIPT='$repo/scripts/qemu-tier/run.sh'"
    echo "export QEMU_TIER_DIR='$tier_dir'"
    remote_env
}
