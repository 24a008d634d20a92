#!/usr/bin/env bash
# The real-QEMU tier's Ceph cluster: `ceph start [fresh]|stop|env|cli`. A real single-node cluster
# from Debian 12's own packages (one monitor, one manager, one OSD on a sparse file-backed
# BlueStore store; no LVM or ceph-volume, the kernel may lack device-mapper) that zones a and
# b use as a libvirt `rbd` storage pool, and their QEMU opens RBD disks through. Loopback
# only: every daemon binds 127.0.0.1 (the monitor on the standard ports, v2 3300 and v1
# 6789; the manager and the OSD on ports from Ceph's 6800-7300 range), and zones a and b
# run in the host's network namespace, so they reach it there.
# The daemons run in their own overlay of the chroot, $QEMU_TIER_DIR/zone-ceph/root (as a
# zone's libvirtd runs in its own), with the cluster itself (configuration, keyrings, the
# monitor's store, the OSD's block file, logs) in $QEMU_TIER_DIR/ceph, bound into that root
# at the same path, so ceph.conf and the keyrings hold paths valid inside and outside it.
# The cluster outlives `ceph stop` (the next start is fast); it is made again only when it
# was never finished.
# Sourced by scripts/qemu-tier/run.sh (not run on its own), after common.sh.
# shellcheck disable=SC2154 # the lowercase settings (tier_dir, pool, ...) are set in common.sh

ceph_zone=ceph
ceph_dir=$tier_dir/ceph
ceph_conf=$ceph_dir/ceph.conf
ceph_admin_keyring=$ceph_dir/ceph.client.admin.keyring
ceph_libvirt_keyring=$ceph_dir/ceph.client.libvirt.keyring
# Written last when the cluster is made: without it, `ceph start` makes it again.
ceph_created=$ceph_dir/.created
ceph_mon_host=127.0.0.1
ceph_mon_v2_port=3300
ceph_mon_v1_port=6789
# The RBD pool, its placement groups, and libvirt's pool of it in zones a and b with the
# secret (the same fixed UUID in both zones) holding client.libvirt's key.
ceph_pool=bigfleet
ceph_pgs=16
ceph_user=libvirt
rbd_pool=bigfleet-rbd
ceph_secret_uuid=1a1fd75c-56e0-4ab5-b708-a3cb767df903
ceph_zones=(a b)
# The OSD's block file (sparse: it takes only what is written) and how long start waits
# for each step.
ceph_block_size=$((8 * 1024 * 1024 * 1024))
ceph_timeout=180
# The daemons, in the order they start (stop: the reverse).
ceph_daemons=(mon.a mgr.a osd.0)

# Runs "$@" with R pointing at the cluster's root (the chroot helpers work on "$R").
in_ceph() {
    local R
    R=$(zone_root "$ceph_zone")
    "$@"
}
# A command inside the cluster's root, with the cluster's ceph.conf (as client.admin).
ceph_run() { in_ceph in_chroot CEPH_CONF="$ceph_conf" "$@"; }
# The ceph CLI, bounded (without a monitor to answer, a call waits client_mount_timeout).
ceph_() { ceph_run timeout 30 ceph "$@"; }

# The PID of daemon $1 (mon.a, mgr.a, osd.0) if it runs.
ceph_pid() { in_ceph chroot_pid "ceph/$1"; }
ceph_running() {
    local daemon
    for daemon in "${ceph_daemons[@]}"; do
        ceph_pid "$daemon" >/dev/null && return 0
    done
    return 1
}

# The stamp mount_zone gives a zone (a root mounted on an older chroot is remounted).
ceph_zone_stamp() { echo "$(base_stamp) $(guest_stamp) $(image_stamp)"; }

# Mounts the cluster's root (an overlay of the chroot, as a zone), its kernel file systems
# and the cluster's directory.
ceph_mount() {
    local root dir
    root=$(zone_root "$ceph_zone")
    dir=$(zone_dir "$ceph_zone")
    if mountpoint -q "$root" && [[ $(cat "$dir/.stamp" 2>/dev/null) != "$(ceph_zone_stamp)" ]]; then
        ceph_unmount
    fi
    mount_zone "$ceph_zone"
    in_ceph mount_chroot
    mkdir -p "$ceph_dir" "$root$ceph_dir" "$root/run/ceph"
    mountpoint -q "$root$ceph_dir" || mount --bind "$ceph_dir" "$root$ceph_dir"
}

ceph_unmount() {
    local root
    root=$(zone_root "$ceph_zone")
    mountpoint -q "$root" || return 0
    in_ceph unmount_chroot
    umount "$root" 2>/dev/null || umount -l "$root"
}

# ceph.conf. Loopback only (the monitor's addresses, and public_addr and cluster_addr for
# the manager's and the OSD's), cephx everywhere, one replica, small memory targets, and
# every file the daemons write in $ceph_dir (run files in the root's /run/ceph).
write_ceph_conf() {
    local fsid
    fsid=$(cat "$ceph_dir/fsid")
    # shellcheck disable=SC2016 # $cluster, $name and $channel are Ceph's metavariables
    {
        echo '# bigfleet qemu tier (scripts/qemu-tier/ceph.sh); rewritten at each `ceph start`'
        echo '[global]'
        echo "fsid = $fsid"
        echo 'mon_initial_members = a'
        echo "mon_host = [v2:$ceph_mon_host:$ceph_mon_v2_port,v1:$ceph_mon_host:$ceph_mon_v1_port]"
        echo "public_addr = $ceph_mon_host"
        echo "cluster_addr = $ceph_mon_host"
        echo 'ms_bind_ipv4 = true'
        echo 'ms_bind_ipv6 = false'
        echo 'auth_cluster_required = cephx'
        echo 'auth_service_required = cephx'
        echo 'auth_client_required = cephx'
        echo 'auth_allow_insecure_global_id_reclaim = false'
        echo 'osd_pool_default_size = 1'
        echo 'osd_pool_default_min_size = 1'
        echo 'osd_pool_default_pg_autoscale_mode = off'
        echo 'osd_crush_chooseleaf_type = 0'
        echo 'mon_allow_pool_size_one = true'
        echo 'mon_allow_pool_delete = true'
        echo 'mon_warn_on_pool_no_redundancy = false'
        # The host's disk is the tier's, not a cluster's: warn below 5% free (not 30%), and
        # the monitor shuts down below 1% (not 5%).
        echo 'mon_data_avail_warn = 5'
        echo 'mon_data_avail_crit = 1'
        echo 'mgr_initial_modules = iostat'
        echo 'run_dir = /run/ceph'
        echo "crash_dir = $ceph_dir/crash"
        echo '[mon]'
        echo "mon_data = $ceph_dir/mon"
        echo "keyring = $ceph_dir/mon/keyring"
        echo "log_file = $ceph_dir/log/\$cluster-\$name.log"
        echo "mon_cluster_log_file = $ceph_dir/log/\$cluster.\$channel.log"
        echo 'mon_memory_target = 536870912'
        # (The monitor's RocksDB cache must stay below its memory target.)
        echo 'rocksdb_cache_size = 134217728'
        echo '[mgr]'
        echo "mgr_data = $ceph_dir/mgr"
        echo "keyring = $ceph_dir/mgr/keyring"
        echo "log_file = $ceph_dir/log/\$cluster-\$name.log"
        echo '[osd]'
        echo "osd_data = $ceph_dir/osd"
        echo "keyring = $ceph_dir/osd/keyring"
        echo "log_file = $ceph_dir/log/\$cluster-\$name.log"
        echo 'osd_objectstore = bluestore'
        echo 'bluestore_block_create = true'
        echo "bluestore_block_size = $ceph_block_size"
        echo 'osd_memory_target = 939524096'
        echo 'bluestore_cache_autotune = false'
        echo 'bluestore_cache_size = 134217728'
        echo "[client.admin]"
        echo "keyring = $ceph_admin_keyring"
        # (A CLI call without a monitor gives up after 30 s, not 300.)
        echo 'client_mount_timeout = 30'
        echo "[client.$ceph_user]"
        echo "keyring = $ceph_libvirt_keyring"
    } >"$ceph_conf.tmp"
    mv "$ceph_conf.tmp" "$ceph_conf"
}

# Starts daemon $1 (mon.a, mgr.a, osd.0) unless it runs. The daemons daemonize themselves
# and write their pid files (no init system in the root).
launch_ceph_daemon() {
    local daemon=$1
    ceph_pid "$daemon" >/dev/null && return 0
    rm -f "$(zone_root "$ceph_zone")/run/ceph/$daemon.pid"
    # (What a daemon prints before it daemonizes goes to its start log.)
    ceph_run "ceph-${daemon%%.*}" -i "${daemon#*.}" --pid-file "/run/ceph/$daemon.pid" 9>&- \
        >"$ceph_dir/log/start-$daemon.log" 2>&1 \
        || die "ceph-${daemon%%.*} failed to start: $(cat "$ceph_dir/log/start-$daemon.log")$(ceph_log_tail "$daemon")"
}

# Runs "$@" quietly; when it fails, dies with its output.
ceph_quiet() {
    local out
    out=$("$@" 2>&1) || die "Ceph: $* failed: $out"
}

# The last lines of daemon $1's log, for an error message.
ceph_log_tail() {
    local log=$ceph_dir/log/ceph-$1.log
    [[ -f $log ]] || return 0
    printf '\n--- the last lines of %s:\n%s' "$log" "$(tail -n 15 "$log")"
}

# Polls "$@" (a shell function) every second until it succeeds, for up to ceph_timeout
# seconds; then dies with $what and the daemons' log tails.
ceph_await() { # what command...
    local what=$1 waited=0 daemon tails=
    shift
    until "$@"; do
        if ((waited >= ceph_timeout)); then
            for daemon in "${ceph_daemons[@]}"; do tails+=$(ceph_log_tail "$daemon"); done
            die "Ceph: gave up after ${ceph_timeout}s waiting for $what$tails"$'\n'"--- ceph -s:"$'\n'"$(ceph_run timeout 10 ceph -s 2>&1 || true)"
        fi
        sleep 1
        ((waited += 1))
    done
}
mon_answers() { ceph_run timeout 10 ceph mon stat >/dev/null 2>&1; }
osd_up() { [[ $(ceph_run timeout 10 ceph osd stat 2>/dev/null) == *" 1 up"* ]]; }
# HEALTH_OK, or HEALTH_WARN with every placement group active+clean (and the OSD up).
ceph_healthy() {
    local health stat
    osd_up || return 1
    health=$(ceph_run timeout 10 ceph health 2>/dev/null) || return 1
    stat=$(ceph_run timeout 10 ceph pg stat 2>/dev/null) || return 1
    [[ $health == HEALTH_OK* || $health == HEALTH_WARN* ]] || return 1
    [[ $stat =~ ^([0-9]+)\ pgs:\ ([0-9]+)\ active\+clean\; ]] \
        && ((BASH_REMATCH[1] > 0 && BASH_REMATCH[1] == BASH_REMATCH[2]))
}

# Makes the cluster from nothing: keys, the monitor's store, the OSD's BlueStore (mkfs on
# its block file), the pool. Whatever a failed attempt left is removed first.
ceph_create() {
    local daemon pid key osd_uuid
    say "ceph: creating the cluster in $ceph_dir"
    for daemon in "${ceph_daemons[@]}"; do
        if pid=$(ceph_pid "$daemon"); then terminate 30 "$pid"; fi
    done
    find "$ceph_dir" -mindepth 1 -delete
    mkdir -p "$ceph_dir"/{mon,mgr,osd,log,crash}
    cat /proc/sys/kernel/random/uuid >"$ceph_dir/fsid"
    write_ceph_conf

    # Every key goes into the monitor's initial keyring, so its store holds them all from
    # the start: the monitor's, client.admin's, the manager's, the OSD's and client.libvirt's
    # (an RBD user of the pool only).
    local mon_keyring=$ceph_dir/ceph.mon.keyring
    ceph_run ceph-authtool --create-keyring "$mon_keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph_run ceph-authtool --create-keyring "$ceph_admin_keyring" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
    ceph_run ceph-authtool --create-keyring "$ceph_dir/mgr/keyring" --gen-key -n mgr.a \
        --cap mon 'allow profile mgr' --cap osd 'allow *' --cap mds 'allow *' >/dev/null
    ceph_run ceph-authtool --create-keyring "$ceph_dir/osd/keyring" --gen-key -n osd.0 \
        --cap mon 'allow profile osd' --cap mgr 'allow profile osd' --cap osd 'allow *' >/dev/null
    ceph_run ceph-authtool --create-keyring "$ceph_libvirt_keyring" --gen-key -n "client.$ceph_user" \
        --cap mon 'profile rbd' --cap osd "profile rbd pool=$ceph_pool" >/dev/null
    for key in "$ceph_admin_keyring" "$ceph_dir/mgr/keyring" "$ceph_dir/osd/keyring" "$ceph_libvirt_keyring"; do
        ceph_run ceph-authtool "$mon_keyring" --import-keyring "$key" >/dev/null
    done
    chmod 600 "$ceph_dir"/*.keyring "$ceph_dir"/{mgr,osd}/keyring

    ceph_run monmaptool --create --fsid "$(cat "$ceph_dir/fsid")" \
        --addv a "[v2:$ceph_mon_host:$ceph_mon_v2_port,v1:$ceph_mon_host:$ceph_mon_v1_port]" \
        "$ceph_dir/monmap" >/dev/null
    # (mkfs wants the monitor's data directory empty or absent.)
    rmdir "$ceph_dir/mon"
    ceph_run ceph-mon --mkfs -i a --monmap "$ceph_dir/monmap" --keyring "$mon_keyring" \
        >"$ceph_dir/log/mkfs-mon.log" 2>&1 \
        || die "ceph-mon --mkfs failed: $(tail -n 15 "$ceph_dir/log/mkfs-mon.log")"
    launch_ceph_daemon mon.a
    ceph_await "the monitor to answer" mon_answers

    # The OSD: its id and UUID in the OSD map, then BlueStore on a sparse block file
    # (bluestore_block_create) in its data directory.
    osd_uuid=$(cat /proc/sys/kernel/random/uuid)
    ceph_quiet ceph_ osd new "$osd_uuid" 0
    ceph_run ceph-osd -i 0 --mkfs --osd-uuid "$osd_uuid" >"$ceph_dir/log/mkfs-osd.log" 2>&1 \
        || die "ceph-osd --mkfs failed: $(tail -n 15 "$ceph_dir/log/mkfs-osd.log")"
    launch_ceph_daemon mgr.a
    launch_ceph_daemon osd.0
    ceph_await "the OSD to come up" osd_up

    ceph_quiet ceph_ osd pool create "$ceph_pool" "$ceph_pgs" "$ceph_pgs" replicated
    ceph_quiet ceph_run timeout 120 rbd pool init "$ceph_pool"
    # No SMART scraping of the OSD's "device" (a file).
    ceph_quiet ceph_ config set mgr mgr/devicehealth/enable_monitoring false
    touch "$ceph_created"
}

# --- the zones' libvirt objects ----------------------------------------------------------

# The secret with client.libvirt's key and the rbd pool, in the zone at $R (defined when
# missing, the secret's value set, the pool started, autostart off).
define_rbd_pool() {
    local key
    key=$(awk '$1 == "key" { print $3 }' "$ceph_libvirt_keyring")
    [[ -n $key ]] || die "no key in $ceph_libvirt_keyring"
    cat >"$R/etc/libvirt/bigfleet-ceph-secret.xml" <<XML
<secret ephemeral='no' private='yes'>
  <uuid>$ceph_secret_uuid</uuid>
  <usage type='ceph'><name>client.$ceph_user secret</name></usage>
</secret>
XML
    virsh_ secret-define /etc/libvirt/bigfleet-ceph-secret.xml >/dev/null
    # The value through a file (never on a command line); its content is base64, as the key.
    (umask 077 && printf '%s' "$key" >"$R/run/bigfleet-ceph.key")
    virsh_ secret-set-value --secret "$ceph_secret_uuid" --file /run/bigfleet-ceph.key >/dev/null \
        || { rm -f "$R/run/bigfleet-ceph.key"; die "cannot set the Ceph secret's value in $R"; }
    rm -f "$R/run/bigfleet-ceph.key"
    if ! virsh_ pool-info "$rbd_pool" >/dev/null 2>&1; then
        cat >"$R/etc/libvirt/bigfleet-rbd-pool.xml" <<XML
<pool type='rbd'>
  <name>$rbd_pool</name>
  <source>
    <name>$ceph_pool</name>
    <host name='$ceph_mon_host' port='$ceph_mon_v1_port'/>
    <auth type='ceph' username='$ceph_user'>
      <secret uuid='$ceph_secret_uuid'/>
    </auth>
  </source>
</pool>
XML
        virsh_ pool-define /etc/libvirt/bigfleet-rbd-pool.xml >/dev/null
    fi
    if grep -Eq '^State:[[:space:]]+running' <<<"$(virsh_ pool-info "$rbd_pool")"; then
        virsh_ pool-refresh "$rbd_pool" >/dev/null
    else
        virsh_ pool-start "$rbd_pool" >/dev/null
    fi
    virsh_ pool-autostart --disable "$rbd_pool" >/dev/null
}

undefine_rbd_pool() {
    virsh_ pool-destroy "$rbd_pool" >/dev/null 2>&1 || true
    virsh_ pool-undefine "$rbd_pool" >/dev/null 2>&1 || true
    virsh_ secret-undefine "$ceph_secret_uuid" >/dev/null 2>&1 || true
}

# Whether zone $1's libvirtd runs and answers.
zone_up() {
    mountpoint -q "$(zone_root "$1")" && in_zone "$1" chroot_pid libvirtd >/dev/null && in_zone "$1" daemon_answers
}

# --- the commands ----------------------------------------------------------------------

# `ceph start [fresh]`: with `fresh`, the cluster is made anew even when one exists.
cmd_ceph_start() {
    local started=$SECONDS daemon z
    prepared || die "not prepared; run: $0 prepare"
    [[ ${1:-} != fresh ]] || rm -f "$ceph_created"
    local taken
    if ! ceph_running; then
        taken=$(ss -Hltnp "( sport = :$ceph_mon_v2_port or sport = :$ceph_mon_v1_port )")
        [[ -z $taken ]] || die "the monitor's ports ($ceph_mon_v2_port, $ceph_mon_v1_port) are taken: $taken"
    fi
    mkdir -p "$ceph_dir"
    ceph_mount
    if [[ -f $ceph_created ]]; then
        write_ceph_conf
        for daemon in "${ceph_daemons[@]}"; do launch_ceph_daemon "$daemon"; done
    else
        ceph_create
    fi
    ceph_await "HEALTH_OK (or HEALTH_WARN) with every placement group active+clean" ceph_healthy
    say "ceph: $(ceph_ health) ($(ceph_ pg stat | cut -d';' -f1)); mon.a pid $(ceph_pid mon.a)," \
        "mgr.a pid $(ceph_pid mgr.a), osd.0 pid $(ceph_pid osd.0)"
    for z in "${ceph_zones[@]}"; do
        if zone_up "$z"; then
            in_zone "$z" define_rbd_pool
            say "zone $z: pool $rbd_pool (ceph pool $ceph_pool), secret $ceph_secret_uuid"
        else
            say "zone $z is not started: no pool $rbd_pool there (run: $0 start, then $0 ceph start)"
        fi
    done
    say "ceph started ($((SECONDS - started))s)"
}

cmd_ceph_stop() {
    local z i pid left
    for z in "${ceph_zones[@]}"; do
        zone_up "$z" && in_zone "$z" undefine_rbd_pool
    done
    for ((i = ${#ceph_daemons[@]} - 1; i >= 0; i--)); do
        if pid=$(ceph_pid "${ceph_daemons[i]}"); then in_ceph terminate 30 "$pid"; fi
    done
    mountpoint -q "$(zone_root "$ceph_zone")" || return 0
    mapfile -t left < <(in_ceph chroot_pids)
    if ((${#left[@]} > 0)); then
        say "stopping leftover processes in the Ceph root: ${left[*]}"
        terminate 10 "${left[@]}"
    fi
    ceph_unmount
    say "ceph stopped"
}

cmd_ceph_env() {
    if ! ceph_running || [[ ! -f $ceph_created ]]; then
        die "Ceph is not running; run: $0 ceph start"
    fi
    echo "export BIGFLEET_QEMU_RBD_POOL='$rbd_pool'"
    echo "export BIGFLEET_QEMU_CEPH_POOL='$ceph_pool'"
    echo "export BIGFLEET_QEMU_CEPH_SECRET_UUID='$ceph_secret_uuid'"
    echo "export BIGFLEET_QEMU_CEPH_USER='$ceph_user'"
    echo "export BIGFLEET_QEMU_CEPH_MON_HOST='$ceph_mon_host'"
    echo "export BIGFLEET_QEMU_CEPH_MON_PORT='$ceph_mon_v1_port'"
    echo "export BIGFLEET_QEMU_CEPH_CONF='$ceph_conf'"
    echo "export BIGFLEET_QEMU_CEPH_KEYRING='$ceph_admin_keyring'"
}

# `ceph cli COMMAND...`: COMMAND (rbd, ceph, rados, ...) inside the cluster's root with its
# ceph.conf, as client.admin; stdin, stdout and the exit status pass through.
cmd_ceph_cli() {
    (($# > 0)) || die "usage: $0 ceph cli COMMAND [ARG...] (e.g. rbd ls $ceph_pool)"
    if ! mountpoint -q "$(zone_root "$ceph_zone")" || [[ ! -f $ceph_created ]]; then
        die "Ceph is not started; run: $0 ceph start"
    fi
    ceph_run "$@"
}

cmd_ceph() {
    local action=${1:-}
    shift || true
    case $action in
    start)
        [[ $# -eq 0 || ${1:-} == fresh ]] || die "usage: $0 ceph start [fresh]"
        lock && cmd_ceph_start "$@"
        ;;
    stop) lock && cmd_ceph_stop ;;
    env) cmd_ceph_env ;;
    cli) cmd_ceph_cli "$@" ;;
    *) die "usage: $0 ceph start [fresh]|stop|env|cli COMMAND..." ;;
    esac
}
