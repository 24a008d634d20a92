#!/usr/bin/env bash
# The phase table of .ci/run and scripts/test.sh: the wall seconds each phase took and how it
# ended, printed when the script exits, passed or failed. Sourced, not run:
#
#   source scripts/phases.sh    sets the EXIT trap that prints the table
#   phase NAME COMMAND...       runs one phase; a failing one ends the script (set -e) and
#                               shows in the table as "failed (exit status N)"
#
# The table's lines live in the file $BIGFLEET_PHASE_LOG, one per phase:
# NAME<TAB>SECONDS<TAB>OUTCOME. The commands a phase runs may append lines of their own
# (scripts/qemu-tier/ci.sh does, one per step of the tier), and notes to print after the table
# to $BIGFLEET_PHASE_LOG.notes (the tier's failed tests). A script sourcing this while the
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

# The EXIT trap: record the phase that failed, if one did; the owner prints the table.
phases_report() {
    local status=$? outcome=ok
    ((status == 0)) || outcome="failed (exit status $status)"
    if [[ -n $phase_name ]]; then
        phase_record "$phase_name" "$((SECONDS - phase_started))" "$outcome"
    fi
    if [[ $phases_owner == true ]]; then
        phase_record total "$((SECONDS - phases_started))" "$outcome"
        echo
        echo "$0: phases (wall seconds)"
        awk -F'\t' '{ printf "  %-36s %6d s  %s\n", $1, $2, $3 }' "$BIGFLEET_PHASE_LOG"
        if [[ -s $BIGFLEET_PHASE_LOG.notes ]]; then
            echo
            cat "$BIGFLEET_PHASE_LOG.notes"
        fi
        rm -f "$BIGFLEET_PHASE_LOG" "$BIGFLEET_PHASE_LOG.notes"
    fi
    exit "$status"
}
trap phases_report EXIT
