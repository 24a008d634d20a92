#!/usr/bin/env bash
# The real-QEMU tier: `ci`, every step in order with timings, then the tests and the
# real-libvirt benchmark (scripts/bench/real-libvirt.sh), always stopping.
# Sourced by scripts/qemu-tier/run.sh (not run on its own), after common.sh.
# shellcheck disable=SC2154 # the lowercase settings (tier_dir, pool, ...) are set in common.sh

# Runs one step and prints how long it took.
timed() {
    local name=$1 started=$SECONDS
    shift
    "$@"
    echo "qemu tier: $name: $((SECONDS - started))s"
}

# The EXIT trap of ci: stop the tier, keep the exit status.
ci_cleanup() {
    local status=$?
    cmd_stop || say "stop failed"
    echo "qemu tier: total: $((SECONDS - ci_started))s"
    exit "$status"
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

cmd_ci() {
    if skipped; then
        return 0
    fi
    timed wait-background-prepare wait_for_background_prepare
    lock
    ci_started=$SECONDS
    # Whatever happens from here on, the daemons are stopped and the mounts undone; the
    # exit status is the first failure's (the test's, if everything before it worked).
    trap ci_cleanup EXIT
    timed stop-leftovers cmd_stop
    timed prepare cmd_prepare
    timed start cmd_start
    eval "$(cmd_env)"
    local test_started=$SECONDS status=0
    # The tests drive the real binary; cargo test builds it (the tests are its package's).
    (cd "$repo" && cargo test --locked -p bigfleet-libvirt --test integration -- \
            --ignored --nocapture --test-threads=1 qemu_e2e:: qemu_faults:: qemu_remote:: \
            qemu_lanes:: qemu_image::) || status=$?
    echo "qemu tier: test: $((SECONDS - test_started))s (exit status $status)"
    # Then the real-libvirt benchmark on the same daemons: numbers only, it fails only when a
    # call errors (the exit status is still the tests' when they failed first).
    local bench_started=$SECONDS bench_status=0
    "$repo/scripts/bench/real-libvirt.sh" || bench_status=$?
    echo "qemu tier: bench: $((SECONDS - bench_started))s (exit status $bench_status)"
    ((status != 0)) || status=$bench_status
    exit "$status"
}
