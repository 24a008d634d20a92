//! One Create's steps on a simulated host, behind the product's step runner
//! ([`steps::Substrate`]): the claim in the process's books, the volumes, the seed, the
//! definition (naming what the claim holds) and the start; step `fail_at` (counting every
//! step) fails with an injected error.

use bigfleet_libvirt_domain::MachineId;
use bigfleet_libvirt_ports::claims::{Claims, Placed};
use bigfleet_libvirt_ports::steps;

use super::books;
use crate::hosts::{Domain, Hosts};

/// One Create's steps on host `host` of `hosts`, for machine `id` (domain `name`), with the
/// process's books of that host.
pub struct OnHost<'a> {
    /// Every host.
    pub hosts: &'a mut Hosts,
    /// The host's index.
    pub host: usize,
    /// The machine.
    pub id: &'a MachineId,
    /// Its domain's name.
    pub name: &'a str,
    /// The process's books of the host.
    pub books: &'a mut Claims,
    /// Where the claim placed it, once claimed.
    pub placed: Placed,
    /// The process that sent the Create has died since (`Domain::late`).
    pub late: bool,

    /// The step that fails, counting every step.
    pub fail_at: Option<usize>,
    /// Steps taken so far.
    pub calls: usize,
}

impl OnHost<'_> {
    fn step(&mut self, what: &str) -> Result<(), String> {
        let call = self.calls;
        self.calls += 1;
        if self.fail_at == Some(call) {
            return Err(format!("injected failure of {what}"));
        }
        Ok(())
    }
}

impl steps::Substrate for OnHost<'_> {
    type Error = String;

    fn claim(&mut self) -> Result<(), String> {
        self.step("claim")?;
        let ask = books::ask(self.id);
        self.placed = self.books.grant(self.name, &ask, &books::dedicated())?;
        Ok(())
    }

    fn release(&mut self) {
        self.books.release(self.name);
    }

    fn keep(&mut self) {
        self.books.commit(self.name);
    }

    fn volume(&mut self, name: &str) -> Result<bool, String> {
        self.step(&format!("volume {name}"))?;
        Ok(self.hosts.volumes[self.host].insert(name.to_owned()))
    }

    fn fill(&mut self, name: &str) -> Result<(), String> {
        self.step(&format!("upload {name}"))
    }

    fn define(&mut self) -> Result<(), String> {
        self.step("define")?;
        let domain = Domain {
            name: self.name.to_owned(),
            running: false,
            cluster: String::new(),
            blob: false,
            held: books::held(&self.placed),
            late: self.late,
        };
        self.hosts.domains[self.host].insert(self.id.clone(), domain);
        Ok(())
    }

    fn start(&mut self) -> Result<(), String> {
        self.step("start")?;
        if let Some(domain) = self.hosts.domains[self.host].get_mut(self.id) {
            domain.running = true;
        }
        Ok(())
    }

    fn undefine(&mut self) -> Result<(), String> {
        self.hosts.domains[self.host].remove(self.id);
        Ok(())
    }

    fn delete_volume(&mut self, name: &str) -> Result<(), String> {
        self.hosts.volumes[self.host].remove(name);
        Ok(())
    }
}
