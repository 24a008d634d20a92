//! A Create's steps as a value, and the one runner that takes them and rolls them back.
//!
//! A Create on a host claims what the machine holds alone (its dedicated CPUs, huge pages
//! and passthrough devices, in the host's books, [`crate::claims`]), makes volumes (the
//! root overlay, the data disks, the cloud-init seed), writes what must be written into
//! them, defines the domain and starts it. Any step may
//! fail; the host must then be left with nothing this attempt made, and with everything an
//! earlier attempt made and this one adopted. [`run`] keeps that rule for any
//! [`Substrate`]: the libvirt adapter's blocking sequence is one, and the simulator's
//! fault-injecting hosts are another, so the rollback the simulator checks is the rollback the
//! product runs.

/// One step of a Create, in the order [`create_steps`] gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Claim what the machine holds alone on the host, and its share of the host's budget.
    Claim,
    /// Create the named volume, or adopt one of that name left by an earlier attempt.
    Volume(String),
    /// Write the named volume's contents (the seed image).
    Fill(String),
    /// Define the domain.
    Define,
    /// Start it.
    Start,
}

/// The steps of a Create that claims, makes `volumes` in order, fills `filled` (each
/// already among `volumes`) right after it is made, then defines and starts the domain.
#[must_use]
pub fn create_steps(volumes: &[String], filled: &[String]) -> Vec<Step> {
    let mut steps = Vec::with_capacity(volumes.len() + filled.len() + 3);
    steps.push(Step::Claim);
    for volume in volumes {
        steps.push(Step::Volume(volume.clone()));
        if filled.contains(volume) {
            steps.push(Step::Fill(volume.clone()));
        }
    }
    steps.extend([Step::Define, Step::Start]);
    steps
}

/// What a Create's steps act on.
pub trait Substrate {
    /// A step's failure.
    type Error;
    /// Claims what the machine holds alone and its share of the host's budget.
    ///
    /// # Errors
    /// When the host has no room for it (nothing is claimed then).
    fn claim(&mut self) -> Result<(), Self::Error>;
    /// Creates the volume, or adopts an existing one of that name: `Ok(true)` when this call
    /// created it (only those are rolled back).
    ///
    /// # Errors
    /// When it could neither create nor adopt it.
    fn volume(&mut self, name: &str) -> Result<bool, Self::Error>;
    /// Writes the volume's contents.
    ///
    /// # Errors
    /// When the write failed.
    fn fill(&mut self, name: &str) -> Result<(), Self::Error>;
    /// Defines the domain.
    ///
    /// # Errors
    /// When it is not defined.
    fn define(&mut self) -> Result<(), Self::Error>;
    /// Starts the defined domain.
    ///
    /// # Errors
    /// When it did not start.
    fn start(&mut self) -> Result<(), Self::Error>;
    /// Rollback: removes the domain this attempt defined.
    ///
    /// # Errors
    /// When it could not be removed.
    fn undefine(&mut self) -> Result<(), Self::Error>;
    /// Rollback: gives the claim back (the domain is gone, or was never defined).
    fn release(&mut self);
    /// Rollback: the domain could not be removed, and its definition still names what the
    /// claim holds, so the claim stays with it (a later scan reads it from the definition).
    fn keep(&mut self);
    /// Rollback: deletes a volume this attempt created.
    ///
    /// # Errors
    /// When it could not be deleted.
    fn delete_volume(&mut self, name: &str) -> Result<(), Self::Error>;
}

/// A Create that failed: the step's error, which step, and what the rollback could not undo.
#[derive(Debug, PartialEq, Eq)]
pub struct Failed<E> {
    /// The failing step's error.
    pub error: E,
    /// The failing step's index.
    pub step: usize,
    /// The rollback's own failures (empty: the host holds nothing this attempt made).
    pub leftovers: Vec<E>,
}

/// Runs `steps` on `substrate`; on a failure removes what this attempt made, the domain first,
/// then gives its claim back (kept while the domain stays), then its volumes newest first.
///
/// # Errors
/// [`Failed`] with the first failing step.
pub fn run<S: Substrate>(substrate: &mut S, steps: &[Step]) -> Result<(), Failed<S::Error>> {
    let mut made: Vec<&str> = Vec::new();
    let (mut claimed, mut defined) = (false, false);
    for (index, step) in steps.iter().enumerate() {
        let done = match step {
            Step::Claim => substrate.claim().map(|()| claimed = true),
            Step::Volume(name) => substrate.volume(name).map(|created| {
                if created {
                    made.push(name);
                }
            }),
            Step::Fill(name) => substrate.fill(name),
            Step::Define => substrate.define().map(|()| defined = true),
            Step::Start => substrate.start(),
        };
        if let Err(error) = done {
            let leftovers = roll_back(substrate, (claimed, defined), &made);
            return Err(Failed {
                error,
                step: index,
                leftovers,
            });
        }
    }
    Ok(())
}

fn roll_back<S: Substrate>(
    substrate: &mut S,
    (claimed, defined): (bool, bool),
    made: &[&str],
) -> Vec<S::Error> {
    let mut leftovers = Vec::new();
    let domain_stays = defined && substrate.undefine().map_err(|e| leftovers.push(e)).is_err();
    // The seeded bug the simulator must catch: the claim is neither given back nor kept.
    if claimed && !cfg!(feature = "bug-rollback-forgets-a-claim") {
        if domain_stays {
            substrate.keep();
        } else {
            substrate.release();
        }
    }
    for (index, volume) in made.iter().enumerate().rev() {
        // The seeded bug the simulator must catch: the second volume made (the first data
        // disk when the type has one) is left behind.
        if cfg!(feature = "bug-rollback-leaks-a-volume") && index == 1 {
            continue;
        }
        leftovers.extend(substrate.delete_volume(volume).err());
    }
    leftovers
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// A host in memory that fails step `fail_at` (counting every call), with `existing`
    /// volumes an earlier attempt left.
    #[derive(Default)]
    struct Memory {
        volumes: BTreeSet<String>,
        /// The claim: none yet, "held", "released" or "kept".
        claim: Option<&'static str>,
        domain: bool,
        undefine_fails: bool,
        running: bool,
        calls: usize,
        fail_at: Option<usize>,
        log: Vec<String>,
    }

    impl Memory {
        fn step(&mut self, what: String) -> Result<(), String> {
            let call = self.calls;
            self.calls += 1;
            if self.fail_at == Some(call) {
                return Err(format!("{what} failed"));
            }
            self.log.push(what);
            Ok(())
        }
    }

    impl Substrate for Memory {
        type Error = String;
        fn claim(&mut self) -> Result<(), String> {
            self.step("claim".to_owned())?;
            self.claim = Some("held");
            Ok(())
        }
        fn release(&mut self) {
            self.claim = Some("released");
        }
        fn keep(&mut self) {
            self.claim = Some("kept");
        }
        fn volume(&mut self, name: &str) -> Result<bool, String> {
            self.step(format!("volume {name}"))?;
            Ok(self.volumes.insert(name.to_owned()))
        }
        fn fill(&mut self, name: &str) -> Result<(), String> {
            self.step(format!("fill {name}"))
        }
        fn define(&mut self) -> Result<(), String> {
            self.step("define".to_owned())?;
            self.domain = true;
            Ok(())
        }
        fn start(&mut self) -> Result<(), String> {
            self.step("start".to_owned())?;
            self.running = true;
            Ok(())
        }
        fn undefine(&mut self) -> Result<(), String> {
            if self.undefine_fails {
                return Err("undefine failed".to_owned());
            }
            self.domain = false;
            Ok(())
        }
        fn delete_volume(&mut self, name: &str) -> Result<(), String> {
            self.volumes.remove(name);
            Ok(())
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_steps_make_every_volume_fill_the_seed_then_define_and_start() {
        let steps = create_steps(&names(&["o", "d1", "s"]), &names(&["s"]));
        let want = [
            Step::Claim,
            Step::Volume("o".into()),
            Step::Volume("d1".into()),
            Step::Volume("s".into()),
            Step::Fill("s".into()),
            Step::Define,
            Step::Start,
        ];
        assert_eq!(steps, want);
        let mut host = Memory::default();
        run(&mut host, &steps).unwrap();
        assert!(host.domain && host.running);
        assert_eq!(host.volumes.len(), 3);
        assert_eq!(host.claim, Some("held"));
    }

    #[test]
    fn a_failure_at_any_step_leaves_only_what_was_there_before() {
        let steps = create_steps(&names(&["o", "d1", "d2", "s"]), &names(&["s"]));
        for fail_at in 0..steps.len() {
            let mut host = Memory {
                fail_at: Some(fail_at),
                ..Memory::default()
            };
            host.volumes.insert("d2".to_owned()); // an earlier attempt's, adopted
            let failed = run(&mut host, &steps).unwrap_err();
            assert_eq!(failed.step, fail_at);
            assert!(failed.leftovers.is_empty());
            assert!(!host.domain, "step {fail_at}: the domain is removed");
            let left: Vec<&str> = host.volumes.iter().map(String::as_str).collect();
            assert_eq!(left, ["d2"], "step {fail_at}: {:?}", host.log);
            let claim = (fail_at > 0).then_some("released");
            assert_eq!(host.claim, claim, "step {fail_at}: the claim is given back");
        }
    }

    #[test]
    fn a_domain_that_cannot_be_removed_keeps_its_claim() {
        let steps = create_steps(&names(&["o", "s"]), &names(&["s"]));
        let start = steps.len() - 1;
        let mut host = Memory {
            fail_at: Some(start),
            undefine_fails: true,
            ..Memory::default()
        };
        let failed = run(&mut host, &steps).unwrap_err();
        assert_eq!(failed.leftovers, ["undefine failed"]);
        assert!(host.domain, "the domain is still defined");
        assert_eq!(host.claim, Some("kept"), "and still holds its claim");
        assert!(host.volumes.is_empty());
    }
}
