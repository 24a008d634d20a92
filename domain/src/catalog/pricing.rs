//! Prices (docs/libvirt.md §4): explicit `--prices` overrides, else a synthetic price from the
//! shape and two hourly rates.
//!
//! Two deliberate differences from the reference: an override must be a finite, non-negative
//! number and must name a catalog type (a typo would otherwise price nothing, silently), and a
//! rate of exactly 0 is honoured (the reference replaces any rate <= 0 with its default, so a
//! free component could not be configured). Negative and non-finite rates are refused rather
//! than replaced, so a mistake is reported instead of papered over.

use std::collections::BTreeMap;

use crate::CapacityType;

use super::{CatalogError, InstanceCatalog};

/// Default USD per vCPU-hour (`--price-per-vcpu-hour`).
pub const DEFAULT_PER_VCPU_HOUR: f64 = 0.0030;
/// Default USD per GiB-hour of memory (`--price-per-gib-hour`).
pub const DEFAULT_PER_GIB_HOUR: f64 = 0.0008;

/// Parses `--prices`: a comma list of `type=usd`. Blank entries are skipped; a later entry
/// for the same type wins.
///
/// # Errors
/// [`CatalogError::PriceEntry`] for an entry without `=`, [`CatalogError::PriceValue`] for an
/// empty type name or a value that is not a finite, non-negative number.
pub fn parse_prices(raw: &str) -> Result<BTreeMap<String, f64>, CatalogError> {
    let mut prices = BTreeMap::new();
    for part in raw
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
    {
        let Some((name, value)) = part.split_once('=') else {
            return Err(CatalogError::PriceEntry {
                part: part.to_owned(),
            });
        };
        let bad = |problem| CatalogError::PriceValue {
            part: part.to_owned(),
            problem,
        };
        let name = name.trim();
        if name.is_empty() {
            return Err(bad("the instance type name is empty; write type=usd"));
        }
        let price: f64 = value
            .trim()
            .parse()
            .map_err(|_| bad("not a number; write USD per hour as a decimal such as 0.05"))?;
        if !price.is_finite() {
            return Err(bad(
                "NaN and infinities are not prices; give a finite USD per hour",
            ));
        }
        if price < 0.0 {
            return Err(bad("negative; give 0 or more USD per hour"));
        }
        // `+ 0.0` turns a parsed "-0" into 0, so no record ever shows a negative zero.
        prices.insert(name.to_owned(), price + 0.0);
    }
    Ok(prices)
}

/// How machines are priced: per-type overrides, then the synthetic formula.
#[derive(Clone, Debug, PartialEq)]
pub struct PriceTable {
    overrides: BTreeMap<String, f64>,
    per_vcpu_hour: f64,
    per_gib_hour: f64,
}

impl Default for PriceTable {
    /// No overrides and the default rates.
    fn default() -> Self {
        Self {
            overrides: BTreeMap::new(),
            per_vcpu_hour: DEFAULT_PER_VCPU_HOUR,
            per_gib_hour: DEFAULT_PER_GIB_HOUR,
        }
    }
}

impl PriceTable {
    /// Builds a table. Rates must be finite and `>= 0`; 0 is honoured (unlike the reference,
    /// which silently replaces rates <= 0 with the defaults). Every override must name a type
    /// in `catalog`.
    ///
    /// # Errors
    /// [`CatalogError::PriceRate`] naming the rate flag, or [`CatalogError::PriceUnknownType`]
    /// naming `--prices` and listing the known types. Override values are re-checked too, so
    /// a table built from any map holds only finite, non-negative prices.
    pub fn new(
        overrides: BTreeMap<String, f64>,
        per_vcpu_hour: f64,
        per_gib_hour: f64,
        catalog: &InstanceCatalog,
    ) -> Result<Self, CatalogError> {
        for (flag, value) in [
            ("--price-per-vcpu-hour", per_vcpu_hour),
            ("--price-per-gib-hour", per_gib_hour),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(CatalogError::PriceRate { flag, value });
            }
        }
        for (name, price) in &overrides {
            if catalog.get(name).is_none() {
                let known = catalog.known();
                return Err(CatalogError::PriceUnknownType {
                    name: name.clone(),
                    known,
                });
            }
            if !price.is_finite() || *price < 0.0 {
                let part = format!("{name}={price}");
                let problem = "not a finite, non-negative USD per hour";
                return Err(CatalogError::PriceValue { part, problem });
            }
        }
        Ok(Self {
            overrides,
            per_vcpu_hour: per_vcpu_hour + 0.0,
            per_gib_hour: per_gib_hour + 0.0,
        })
    }

    /// The per-type overrides.
    #[must_use]
    pub fn overrides(&self) -> &BTreeMap<String, f64> {
        &self.overrides
    }

    /// USD per vCPU-hour.
    #[must_use]
    pub fn per_vcpu_hour(&self) -> f64 {
        self.per_vcpu_hour
    }

    /// USD per GiB-hour.
    #[must_use]
    pub fn per_gib_hour(&self) -> f64 {
        self.per_gib_hour
    }

    /// USD per hour for one machine: 0 for bare metal; else the override if there is one
    /// (even 0); else 0 for a type the catalog lacks; else
    /// `vcpu × per_vcpu_hour + memory_mib / 1024 × per_gib_hour`, unrounded.
    #[must_use]
    pub fn price(&self, type_name: &str, capacity: CapacityType, catalog: &InstanceCatalog) -> f64 {
        if capacity == CapacityType::BareMetal {
            return 0.0;
        }
        if let Some(price) = self.overrides.get(type_name) {
            return *price;
        }
        let Some(shape) = catalog.get(type_name) else {
            return 0.0;
        };
        // u32 → f64 is exact; memory sizes are far below 2^53 MiB.
        #[allow(clippy::cast_precision_loss)]
        let gib = shape.memory_mib as f64 / 1024.0;
        f64::from(shape.vcpu) * self.per_vcpu_hour + gib * self.per_gib_hour
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn parse_prices_grammar() {
        assert!(parse_prices("").unwrap().is_empty());
        assert!(parse_prices(" , ,").unwrap().is_empty());
        let got =
            parse_prices(" kvm.small = 0.05 ,kvm.large=1e-3,, kvm.small=0.07,kvm.x=0").unwrap();
        let want = BTreeMap::from([
            ("kvm.large".to_owned(), 0.001),
            ("kvm.small".to_owned(), 0.07),
            ("kvm.x".to_owned(), 0.0),
        ]);
        assert_eq!(got, want);
        let negative_zero = parse_prices("a=-0").unwrap()["a"];
        assert!(negative_zero.is_sign_positive());
    }

    #[test]
    fn parse_prices_refuses_entries_without_equals() {
        let msg = parse_prices("kvm.small=1,kvm.large")
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "--prices entry \"kvm.large\" must be type=usd, e.g. kvm.small=0.01"
        );
    }

    #[test]
    fn parse_prices_refuses_bad_values() {
        let cases = [
            ("a=abc", "not a number"),
            ("a=", "not a number"),
            ("a=NaN", "NaN and infinities"),
            ("a=inf", "NaN and infinities"),
            ("a=-Infinity", "NaN and infinities"),
            ("a=-0.01", "negative"),
            ("=1", "name is empty"),
        ];
        for (raw, needle) in cases {
            let msg = parse_prices(raw).unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!("--prices entry {raw:?}: bad price, ")),
                "{msg}"
            );
            assert!(msg.contains(needle), "{raw}: {msg}");
        }
    }

    #[test]
    fn default_formula_values() {
        let (table, catalog) = (PriceTable::default(), InstanceCatalog::builtin());
        let on_demand = CapacityType::OnDemand;
        for (name, want) in [
            ("kvm.small", 0.0092),
            ("kvm.medium", 0.0184),
            ("kvm.large", 0.0368),
            ("kvm.xlarge", 0.0736),
        ] {
            let got = table.price(name, on_demand, &catalog);
            assert!(close(got, want), "{name}: {got} != {want}");
        }
    }

    #[test]
    fn bare_metal_is_free_override_wins_unknown_is_zero() {
        let catalog = InstanceCatalog::builtin();
        let overrides = parse_prices("kvm.small=0.05,kvm.medium=0").unwrap();
        let table = PriceTable::new(overrides, 0.01, 0.002, &catalog).unwrap();
        assert_eq!(
            table.price("kvm.small", CapacityType::BareMetal, &catalog),
            0.0
        );
        assert_eq!(
            table.price("kvm.small", CapacityType::OnDemand, &catalog),
            0.05
        );
        assert_eq!(
            table.price("kvm.medium", CapacityType::OnDemand, &catalog),
            0.0
        );
        assert_eq!(
            table.price("kvm.unknown", CapacityType::OnDemand, &catalog),
            0.0
        );
        let large = table.price("kvm.large", CapacityType::OnDemand, &catalog);
        assert!(close(large, 8.0 * 0.01 + 16.0 * 0.002), "{large}");
        assert!(table.price("kvm.large", CapacityType::OnDemand, &catalog) > 0.0);
    }

    #[test]
    fn zero_rates_are_honoured_not_replaced() {
        let catalog = InstanceCatalog::builtin();
        let table = PriceTable::new(BTreeMap::new(), 0.0, 0.0, &catalog).unwrap();
        assert_eq!(
            table.price("kvm.xlarge", CapacityType::OnDemand, &catalog),
            0.0
        );
        let cpu_only = PriceTable::new(BTreeMap::new(), 0.5, 0.0, &catalog).unwrap();
        assert!(close(
            cpu_only.price("kvm.small", CapacityType::OnDemand, &catalog),
            1.0
        ));
        assert_eq!(
            (cpu_only.per_vcpu_hour(), cpu_only.per_gib_hour()),
            (0.5, 0.0)
        );
        assert!(cpu_only.overrides().is_empty());
    }

    #[test]
    fn negative_or_non_finite_rates_are_refused() {
        let catalog = InstanceCatalog::builtin();
        for (vcpu, gib, flag) in [
            (-0.1, 0.0, "--price-per-vcpu-hour"),
            (f64::NAN, 0.0, "--price-per-vcpu-hour"),
            (0.0, f64::INFINITY, "--price-per-gib-hour"),
            (0.0, -1.0, "--price-per-gib-hour"),
        ] {
            let msg = PriceTable::new(BTreeMap::new(), vcpu, gib, &catalog).unwrap_err();
            let msg = msg.to_string();
            assert!(
                msg.starts_with(&format!("{flag} must be a finite number >= 0")),
                "{msg}"
            );
        }
    }

    #[test]
    fn overrides_must_name_catalog_types() {
        let catalog = InstanceCatalog::builtin();
        let overrides = parse_prices("kvm.smal=0.05").unwrap();
        let msg = PriceTable::new(
            overrides,
            DEFAULT_PER_VCPU_HOUR,
            DEFAULT_PER_GIB_HOUR,
            &catalog,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            msg,
            "--prices names instance type \"kvm.smal\", which is not in the instance-type \
             catalog (known types: kvm.large, kvm.medium, kvm.small, kvm.xlarge); fix the name \
             or add the type to --instance-types"
        );
        let nan = BTreeMap::from([("kvm.small".to_owned(), f64::NAN)]);
        assert!(PriceTable::new(nan, 0.0, 0.0, &catalog).is_err());
    }
}
