//! The simulation runner: `--seed N`, `--seeds A..B`, `--seeds-file PATH`,
//! `--check-determinism N` (see `sim/README.md`). Built without `--cfg madsim` it only
//! explains how to run it.

use std::process::ExitCode;

#[cfg(madsim)]
fn main() -> ExitCode {
    bigfleet_libvirt_sim::runner::main()
}

#[cfg(not(madsim))]
fn main() -> ExitCode {
    eprintln!("{}", bigfleet_libvirt_sim::HOW_TO_RUN);
    ExitCode::from(2)
}
