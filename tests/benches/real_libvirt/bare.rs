//! The bare sequence: the libvirt calls the provider's Create makes up to Idle, in its order
//! (`infra/libvirt/src/service/lifecycle.rs`: the ownership lookup, the pool, the overlay and seed
//! volumes with their lookups, the seed upload, define, start, autostart), through the same
//! `virt` crate and one shared connection per zone, with the same documents
//! (`bigfleet_libvirt_libvirt::xml`) and nothing around them: no gRPC, no store, no
//! per-host queue. The seed's bytes are as many as the provider's seed volume holds (the
//! ISO is built in memory, not by libvirt).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bigfleet_libvirt_libvirt::xml::{
    self, Base, DirectKernel, Disks, DomainSpec, DomainType, Placed, Platform, VolumePaths,
};
use bigfleet_libvirt_libvirt::{CpuChoice, Tag};
use virt::connect::Connect;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use super::BoxError;
use crate::qemu_zones::{Tier, Zone};

/// One zone's side of the bare sequence.
pub struct Bare {
    conn: Connect,
    pool: String,
    /// The golden image's path and the overlay size (the provider caches them per
    /// connection too).
    base: (String, u64),
    platform: Platform,
    cpu: Option<CpuChoice>,
    /// Bytes uploaded into each seed volume.
    pub seed_bytes: usize,
    /// Domain-name prefix of this run's bare domains.
    prefix: String,
    /// Each Create's steps: the volumes (lookups and creates), the seed upload, define, and
    /// start with autostart.
    pub steps: Mutex<Vec<[Duration; 4]>>,
}

/// The guest every side boots: the tier's one vCPU, 384 MiB type.
pub const VCPU: u32 = 1;
pub const MEMORY_MIB: u64 = 384;
/// The largest seed chunk the provider sends per stream write.
const UPLOAD_CHUNK: usize = 256 * 1024;

fn text(e: &virt::error::Error) -> String {
    e.message().to_owned()
}

impl Bare {
    /// Opens its own connection to `zone` (the provider holds one per zone too).
    pub fn open(
        tier: &Tier,
        zone: &Zone,
        cpu: Option<&str>,
        prefix: &str,
    ) -> Result<Self, BoxError> {
        let conn = Connect::open(Some(&zone.uri))
            .map_err(|e| format!("connect {}: {}", zone.uri, text(&e)))?;
        let domain_type = match tier.domain_type {
            "kvm" => DomainType::Kvm,
            _ => DomainType::Qemu,
        };
        let platform = Platform {
            domain_type,
            kernel: Some(DirectKernel {
                kernel: tier.kernel.clone(),
                initrd: Some(tier.initrd.clone()),
                cmdline: tier.cmdline.clone(),
            }),
            ..Platform::default()
        };
        let cpu = cpu.map(CpuChoice::parse).transpose()?;
        let pool = conn
            .lookup_storage_pool_by_name(&tier.pool)
            .map_err(|e| text(&e))?;
        let golden = pool
            .lookup_storage_vol_by_name(&tier.image)
            .map_err(|e| text(&e))?;
        let path = golden.path().map_err(|e| text(&e))?;
        let capacity = golden.info().map_err(|e| text(&e))?.capacity;
        Ok(Self {
            conn,
            pool: tier.pool.clone(),
            base: (path, capacity.max(40 << 30)),
            platform,
            cpu,
            seed_bytes: 64 * 1024,
            prefix: prefix.to_owned(),
            steps: Mutex::new(Vec::new()),
        })
    }

    /// The name of bare domain `n`.
    pub fn name(&self, n: usize) -> String {
        format!("{}-{n}", self.prefix)
    }

    /// The spec of bare domain `name`: no NIC, the tier's platform and CPU.
    fn spec(&self, name: &str, tag: Tag, overlay: String, seed: String) -> DomainSpec {
        DomainSpec {
            name: name.to_owned(),
            tag,
            instance_type: String::new(),
            instance_id: format!("{name}-bare"),
            vcpu: VCPU,
            memory_mib: MEMORY_MIB,
            placed: Placed::default(),
            cpu: self.cpu.clone(),
            nics: Vec::new(),
            address: None,
            platform: self.platform.clone(),
            disks: Disks {
                overlay,
                seed,
                console: String::new(),
                base: Base {
                    path: self.base.0.clone(),
                    format: "qcow2".to_owned(),
                    overlay_bytes: self.base.1,
                    rbd: None,
                },
                data: Vec::new(),
                ignition: None,
            },
            user_data: Arc::from(&b""[..]),
            tpm: false,
            secure_boot: false,
        }
    }

    /// One Create's calls for domain `n`; returns their wall time.
    pub fn create(&self, n: usize) -> Result<Duration, BoxError> {
        let name = self.name(n);
        let start = Instant::now();
        // The provider first looks for a domain of that name it already owns.
        if self.conn.lookup_domain_by_name(&name).is_ok() {
            return Err(format!(
                "bare domain {name} already exists (a leftover of an earlier run?)"
            )
            .into());
        }
        let pool = self
            .conn
            .lookup_storage_pool_by_name(&self.pool)
            .map_err(|e| text(&e))?;
        let (base_path, capacity) = (&self.base.0, self.base.1);
        let overlay_name = format!("{name}-overlay.qcow2");
        let _ = pool.lookup_storage_vol_by_name(&overlay_name);
        let overlay_xml = xml::overlay_volume(&overlay_name, capacity, base_path, "qcow2");
        let overlay = StorageVol::create_xml(&pool, &overlay_xml, 0)
            .map_err(|e| format!("create {overlay_name}: {}", text(&e)))?;
        let overlay_path = overlay.path().map_err(|e| text(&e))?;
        let seed_name = format!("{name}-cidata.iso");
        let _ = pool.lookup_storage_vol_by_name(&seed_name);
        let seed_xml = xml::seed_volume(&seed_name, self.seed_bytes as u64);
        let seed = StorageVol::create_xml(&pool, &seed_xml, 0)
            .map_err(|e| format!("create {seed_name}: {}", text(&e)))?;
        let volumes = start.elapsed();
        self.upload(&seed)?;
        let uploaded = start.elapsed();
        let seed_path = seed.path().map_err(|e| text(&e))?;
        let tag = Tag::new(&self.prefix, &n.to_string());
        let spec = self.spec(&name, tag, overlay_name, seed_name);
        let paths = VolumePaths {
            overlay: &overlay_path,
            seed: &seed_path,
            console: None,
            data: &[],
            ignition: None,
        };
        let document = xml::domain(&spec, paths);
        let domain = self
            .conn
            .define_domain_xml(&document)
            .map_err(|e| format!("define {name}: {}", text(&e)))?;
        let defined = start.elapsed();
        domain
            .create()
            .map_err(|e| format!("start {name}: {}", text(&e)))?;
        domain
            .set_autostart(true)
            .map_err(|e| format!("autostart {name}: {}", text(&e)))?;
        let total = start.elapsed();
        let steps = [
            volumes,
            uploaded - volumes,
            defined - uploaded,
            total - defined,
        ];
        self.steps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(steps);
        Ok(total)
    }

    fn upload(&self, volume: &StorageVol) -> Result<(), BoxError> {
        let bytes = vec![0u8; self.seed_bytes];
        let stream = Stream::new(&self.conn, 0).map_err(|e| text(&e))?;
        volume
            .upload(&stream, 0, bytes.len() as u64, 0)
            .map_err(|e| text(&e))?;
        for chunk in bytes.chunks(UPLOAD_CHUNK) {
            let mut sent = 0;
            while sent < chunk.len() {
                let n = stream.send(&chunk[sent..]).map_err(|e| text(&e))?;
                if n <= 0 {
                    return Err("the upload stream accepted no data".into());
                }
                sent += n.unsigned_abs();
            }
        }
        stream
            .finish()
            .map_err(|e| format!("finish upload: {}", text(&e)).into())
    }

    /// Removes bare domain `n` and its volumes (not timed).
    pub fn remove(&self, n: usize) -> Result<(), BoxError> {
        let name = self.name(n);
        if let Ok(domain) = self.conn.lookup_domain_by_name(&name) {
            if domain.is_active().unwrap_or(false) {
                domain
                    .destroy()
                    .map_err(|e| format!("destroy {name}: {}", text(&e)))?;
            }
            domain
                .undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM)
                .map_err(|e| format!("undefine {name}: {}", text(&e)))?;
        }
        let pool = self
            .conn
            .lookup_storage_pool_by_name(&self.pool)
            .map_err(|e| text(&e))?;
        for volume in [
            format!("{name}-overlay.qcow2"),
            format!("{name}-cidata.iso"),
        ] {
            if let Ok(vol) = pool.lookup_storage_vol_by_name(&volume) {
                vol.delete(0)
                    .map_err(|e| format!("delete {volume}: {}", text(&e)))?;
            }
        }
        Ok(())
    }
}

/// Runs `count` bare Creates on each of `sides`, `width` at a time per side (threads
/// sharing the side's connection); returns each Create's time and the wall time of all.
pub fn run(
    sides: &[Arc<Bare>],
    first: usize,
    count: usize,
    width: usize,
) -> Result<(Vec<Duration>, Duration), BoxError> {
    let start = Instant::now();
    let mut handles = Vec::new();
    for side in sides {
        for lane in 0..width {
            let side = Arc::clone(side);
            handles.push(std::thread::spawn(
                move || -> Result<Vec<Duration>, String> {
                    (first + lane..first + count)
                        .step_by(width)
                        .map(|n| side.create(n).map_err(|e| e.to_string()))
                        .collect()
                },
            ));
        }
    }
    let mut times = Vec::new();
    for handle in handles {
        times.extend(handle.join().map_err(|_| "a bare worker panicked")??);
    }
    Ok((times, start.elapsed()))
}

/// Removes bare domains `first..first + count` of every side, all at once (destroying a
/// domain takes seconds; none of this is timed).
pub fn remove(sides: &[Arc<Bare>], first: usize, count: usize) -> Result<(), BoxError> {
    let mut handles = Vec::new();
    for side in sides {
        for n in first..first + count {
            let side = Arc::clone(side);
            handles.push(std::thread::spawn(move || {
                side.remove(n).map_err(|e| e.to_string())
            }));
        }
    }
    for handle in handles {
        handle.join().map_err(|_| "a bare remover panicked")??;
    }
    Ok(())
}
