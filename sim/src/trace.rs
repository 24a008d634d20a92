//! The event trace of one run: every RPC, host effect, durable commit and process event, as
//! lines stamped with simulated time. The runner prints a SHA-256 of all lines; the same
//! seed must give the same hash (determinism is itself tested).
//!
//! Only the last lines are kept in memory (they are printed with a failure); `--trace`
//! keeps them all.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// How many trailing lines a failure report shows.
const TAIL_LINES: usize = 60;

/// A hashed, optionally kept, sequence of trace lines.
#[derive(Debug)]
pub struct Trace {
    hasher: Sha256,
    lines: u64,
    tail: VecDeque<String>,
    all: Option<Vec<String>>,
}

impl Trace {
    /// An empty trace; `keep_all` keeps every line for `--trace`.
    #[must_use]
    pub fn new(keep_all: bool) -> Self {
        Self {
            hasher: Sha256::new(),
            lines: 0,
            tail: VecDeque::with_capacity(TAIL_LINES),
            all: keep_all.then(Vec::new),
        }
    }

    /// Appends one event at simulated time `at`.
    pub fn record(&mut self, at: Duration, event: &str) {
        let mut line = String::with_capacity(event.len() + 16);
        let _ = write!(line, "{:>11.6} {event}", at.as_secs_f64());
        self.hasher.update(line.as_bytes());
        self.hasher.update(b"\n");
        self.lines += 1;
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        if let Some(all) = &mut self.all {
            all.push(line.clone());
        }
        self.tail.push_back(line);
    }

    /// Number of lines so far.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.lines
    }

    /// Whether nothing was recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lines == 0
    }

    /// The SHA-256 of every line so far, as hex.
    #[must_use]
    pub fn digest(&self) -> String {
        let digest = self.hasher.clone().finalize();
        digest.iter().fold(String::new(), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
    }

    /// The last lines.
    #[must_use]
    pub fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }

    /// Every line, when they were kept.
    #[must_use]
    pub fn take_all(&mut self) -> Option<Vec<String>> {
        self.all.take()
    }
}
