#!/usr/bin/env bash
# The phase table of .ci/run and scripts/test.sh: the wall seconds each phase took and how it
# ended, printed when the script exits, passed or failed. Sourced, not run:
#
#   source scripts/phases.sh    sets the EXIT trap that prints the table
#   phase NAME COMMAND...       runs one phase; a failing one ends the script (set -e) and
#                               shows in the table as "failed (exit status N)"
#   phase_start NAME LOG COMMAND...
#                               starts a phase in the background, its output going to LOG
#                               (one at a time), while the phases after it run
#   phase_finish                waits for it, prints LOG, and ends the script (set -e) when
#                               it failed; the table shows its own seconds and outcome. A
#                               script that exits before it is finished stops it.
#
# The table's lines live in the file $BIGFLEET_PHASE_LOG, one per phase:
# NAME<TAB>SECONDS<TAB>OUTCOME. The commands a phase runs may append lines of their own
# (scripts/qemu-tier/ci.sh does, one per step of the tier). A script sourcing this while the
# variable already names a file (scripts/test.sh run by .ci/run) appends its phases to that
# file and leaves the table to the script that created it.

if [[ -n ${BIGFLEET_PHASE_LOG:-} && -f $BIGFLEET_PHASE_LOG ]]; then
    phases_owner=false
else
    BIGFLEET_PHASE_LOG=$(mktemp)
    export BIGFLEET_PHASE_LOG
    phases_owner=true
fi
phases_started=$SECONDS phase_name="" phase_started=0

phase_record() { # name seconds outcome
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$BIGFLEET_PHASE_LOG"
}

phase() { # name command...
    phase_name=$1 phase_started=$SECONDS
    shift
    "$@"
    phase_record "$phase_name" "$((SECONDS - phase_started))" ok
    phase_name=""
}

phase_background_pid="" phase_background_log=""

phase_start() { # name log command...
    local name=$1
    phase_background_log=$2
    shift 2
    (
        started=$SECONDS status=0
        "$@" >"$phase_background_log" 2>&1 || status=$?
        outcome=ok
        ((status == 0)) || outcome="failed (exit status $status)"
        phase_record "$name" "$((SECONDS - started))" "$outcome"
        exit "$status"
    ) &
    phase_background_pid=$!
}

phase_finish() {
    local status=0
    wait "$phase_background_pid" || status=$?
    phase_background_pid=""
    cat "$phase_background_log"
    return "$status"
}

# SIGTERM to process $1 and everything under it, children first.
phase_stop_tree() {
    local child
    for child in $(pgrep -P "$1"); do
        phase_stop_tree "$child"
    done
    kill -TERM "$1" 2>/dev/null || true
}

# The EXIT trap: stop a background phase still running; record the phase that failed, if one
# did; the owner prints the table.
phases_report() {
    local status=$? outcome=ok
    if [[ -n $phase_background_pid ]]; then
        phase_stop_tree "$phase_background_pid"
        wait "$phase_background_pid" 2>/dev/null || true
    fi
    ((status == 0)) || outcome="failed (exit status $status)"
    if [[ -n $phase_name ]]; then
        phase_record "$phase_name" "$((SECONDS - phase_started))" "$outcome"
    fi
    if [[ $phases_owner == true ]]; then
        phase_record total "$((SECONDS - phases_started))" "$outcome"
        echo
        echo "$0: phases (wall seconds)"
        awk -F'\t' '{ printf "  %-36s %6d s  %s\n", $1, $2, $3 }' "$BIGFLEET_PHASE_LOG"
        rm -f "$BIGFLEET_PHASE_LOG"
    fi
    exit "$status"
}
trap phases_report EXIT
