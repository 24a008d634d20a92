#!/usr/bin/env bash
# The real-QEMU tier: `ci`, every step in order with timings, then the tests (one cargo test
# run per group) and the real-libvirt benchmark (scripts/bench/real-libvirt.sh), always
# stopping. Sourced by scripts/qemu-tier/run.sh (not run on its own), after common.sh.
# shellcheck disable=SC2154 # the lowercase settings (tier_dir, pool, ...) are set in common.sh

# The test groups, one `cargo test` run each (in this order, so each group's time shows);
# every group runs even when an earlier one failed.
test_groups=(qemu_e2e qemu_faults qemu_crash qemu_slow on_real_libvirtd qemu_ceph qemu_lanes qemu_remote)
# The real-image group drives zone c alone (its own daemon, network namespace and golden
# image; no test of the groups above touches it), so it runs beside them rather than after
# them: its TCG boots of a real Debian image are the tier's longest group.
beside_group=qemu_image

# Prints how long a step took and how it ended ("ok", "failed (exit status N)"), and appends
# "tier: NAME<TAB>SECONDS<TAB>OUTCOME" to $BIGFLEET_PHASE_LOG when that is set (scripts/test.sh
# sets it and prints the lines in its phase table).
record_step() { # name seconds outcome
    echo "qemu tier: $1: $2s ($3)"
    if [[ -n ${BIGFLEET_PHASE_LOG:-} ]]; then
        printf 'tier: %s\t%s\t%s\n' "$1" "$2" "$3" >>"$BIGFLEET_PHASE_LOG"
    fi
}

# Runs one step. A failing step ends ci (set -e) through its EXIT trap, which records the
# step as failed: step_name is the step that is running, if any.
step_name="" step_started=0
timed() {
    step_name=$1 step_started=$SECONDS
    shift
    "$@"
    record_step "$step_name" "$((SECONDS - step_started))" ok
    step_name=""
}

# The EXIT trap of ci: record the step that failed, if one did, stop the tier, keep the exit
# status.
ci_cleanup() {
    local status=$? stop_started=$SECONDS stop_outcome=ok
    if [[ -n $step_name ]]; then
        record_step "$step_name" "$((SECONDS - step_started))" "failed (exit status $status)"
        step_name=""
    fi
    cmd_stop || {
        stop_outcome="failed (exit status $?)"
        say "stop failed"
    }
    record_step stop "$((SECONDS - stop_started))" "$stop_outcome"
    echo "qemu tier: total: $((SECONDS - ci_started))s"
    exit "$status"
}

# Runs one command as a step whose failure does not end ci: records it, returns its status.
counted() { # name command...
    local name=$1 started=$SECONDS status=0
    shift
    "$@" || status=$?
    record_step "$name" "$((SECONDS - started))" "$( ((status == 0)) && echo ok || echo "failed (exit status $status)")"
    return "$status"
}

# Starts `prepare` detached, its output in $tier_dir/prepare.log and its pid in
# $tier_dir/prepare.pid, unless the tier is skipped here or a background prepare runs.
prepare_in_background() {
    if skipped; then
        return 0
    fi
    mkdir -p "$tier_dir"
    if background_prepare_running; then
        say "a background prepare already runs (pid $(cat "$tier_dir/prepare.pid"))"
        return 0
    fi
    setsid "$repo/scripts/qemu-tier/run.sh" prepare >"$tier_dir/prepare.log" 2>&1 </dev/null &
    echo $! >"$tier_dir/prepare.pid"
    say "prepare runs in the background (pid $!, log: $tier_dir/prepare.log)"
}

background_prepare_running() {
    local pid
    pid=$(cat "$tier_dir/prepare.pid" 2>/dev/null) || return 1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

# Waits for a background prepare to end and shows how it went. A failed one is not fatal
# here: ci's own prepare runs next and either finishes the work or fails with the reason.
wait_for_background_prepare() {
    [[ -f $tier_dir/prepare.pid ]] || return 0
    if background_prepare_running; then
        say "waiting for the background prepare (pid $(cat "$tier_dir/prepare.pid"), log: $tier_dir/prepare.log)"
        while background_prepare_running; do sleep 5; done
    fi
    rm -f "$tier_dir/prepare.pid"
    say "the background prepare ended; the last lines of its log:"
    tail -n 5 "$tier_dir/prepare.log" >&2 || true
}

# The tier's tests are integration tests of the binary's package: built once, then run one
# group at a time. `--workspace` (not `-p bigfleet-libvirt`) resolves features as
# scripts/test.sh's `cargo test --workspace` build did, so the build is reused: with `-p`,
# cargo unified features differently and rebuilt tokio, hyper, tonic and every crate of
# ours (70 s in CI).
build_tests() {
    (cd "$repo" && cargo test --locked --workspace --test integration --no-run)
}
# A failing group's panics (each with the lines after it) go to the phase table's notes
# ($BIGFLEET_PHASE_LOG.notes, printed after the table), so the end of a CI log says why.
test_group() { # group
    local log="$tier_dir/test-$1.log" status=0
    mkdir -p "$tier_dir"
    # The group's status is cargo's, never tee's.
    if ! (cd "$repo" && cargo test --locked --workspace --test integration -- \
        --ignored --nocapture --test-threads=1 "$1::") 2>&1 | tee "$log"; then
        status=${PIPESTATUS[0]}
    fi
    if ((status != 0)) && [[ -n ${BIGFLEET_PHASE_LOG:-} ]]; then
        {
            echo "test $1 failed; its panics:"
            grep -A 6 "panicked at" "$log" | cut -c1-400 | head -n 60 || true
        } >>"$BIGFLEET_PHASE_LOG.notes"
    fi
    return "$status"
}

cmd_ci() {
    if skipped; then
        if [[ -n ${BIGFLEET_PHASE_LOG:-} ]]; then
            printf 'tier\t0\tskipped: %s\n' "$(skip_reason)" >>"$BIGFLEET_PHASE_LOG"
        fi
        return 0
    fi
    timed wait-background-prepare wait_for_background_prepare
    lock
    ci_started=$SECONDS
    # Whatever happens from here on, the daemons are stopped and the mounts undone; the
    # exit status is the first failure's (the tests', if everything before them worked).
    trap ci_cleanup EXIT
    timed stop-leftovers cmd_stop
    timed prepare cmd_prepare
    timed start cmd_start
    eval "$(cmd_env)"
    # The single-node Ceph cluster behind zones a and b's rbd pool (the qemu_ceph tests),
    # made anew for every run: a cluster kept from an earlier run can hold damaged objects
    # (seen on a reused machine: a BlueStore checksum error in an old golden image's object
    # map, after which `rbd snap purge` of that image waited forever), and a run must not
    # depend on what earlier runs left.
    timed ceph cmd_ceph_start fresh
    eval "$(cmd_ceph_env)"
    # The tests drive the real binary; cargo builds it with them (the tests are its
    # package's), once, before the groups run.
    timed build-tests build_tests
    local status=0 failed group beside_pid beside_started=$SECONDS beside_status=0
    local beside_out="$tier_dir/beside-$beside_group.out"
    mkdir -p "$tier_dir"
    # Its own time is written when it ends, for its phase line.
    rm -f "$beside_out.seconds"
    (
        started=$SECONDS group_status=0
        test_group "$beside_group" || group_status=$?
        echo "$((SECONDS - started))" >"$beside_out.seconds"
        exit "$group_status"
    ) >"$beside_out" 2>&1 &
    beside_pid=$!
    for group in "${test_groups[@]}"; do
        counted "test $group" test_group "$group" || {
            failed=$?
            ((status != 0)) || status=$failed
        }
    done
    wait "$beside_pid" || beside_status=$?
    say "the $beside_group group ran beside the others; its output:"
    cat "$beside_out"
    record_step "test $beside_group (beside the others)" \
        "$(cat "$beside_out.seconds" 2>/dev/null || echo "$((SECONDS - beside_started))")" \
        "$( ((beside_status == 0)) && echo ok || echo "failed (exit status $beside_status)")"
    ((status != 0)) || status=$beside_status
    # Then the real-libvirt benchmark on the same daemons: numbers only, it fails only when a
    # call errors (the exit status is still the tests' when they failed first).
    counted bench "$repo/scripts/bench/real-libvirt.sh" || {
        failed=$?
        ((status != 0)) || status=$failed
    }
    exit "$status"
}
