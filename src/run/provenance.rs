//! `provenance.json`: where a run's numbers came from (code version, crates, hardware, data
//! checksums, start and end times).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::data;
use crate::data::DataSuite;
use crate::manifest::Experiment;

/// `provenance.json` of a run: where its numbers came from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Provenance {
    pub acpo_version: String,
    pub git_commit: String,
    pub crates: BTreeMap<String, String>,
    pub fingerprint: String,
    pub hardware: BTreeMap<String, String>,
    /// Data files and their SHA-256 (checked on load), or the synthetic generator's version.
    pub data: BTreeMap<String, String>,
    pub started_unix: u64,
    pub started_utc: String,
    pub finished_unix: Option<u64>,
    pub finished_utc: Option<String>,
    pub steps_done: usize,
    /// The engine that trained the run when it was not acpo's (`verl` for `acpo import verl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Metrics the engine logged as non-finite (verl's file logger writes NaN and ±∞ as null),
    /// with the steps: left out of metrics.jsonl, never read as a number.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub non_finite_metrics: BTreeMap<String, Vec<usize>>,
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `YYYY-MM-DDThh:mm:ssZ` from Unix seconds (Howard Hinnant's civil-from-days).
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

impl Provenance {
    /// The provenance of a run of `exp` starting now on `device` (`cpu`, `cuda:0`).
    pub fn start(exp: &Experiment, device: &str) -> Provenance {
        provenance(exp, device)
    }

    /// Marks the run as stopped after `steps` steps, now.
    pub fn finish(&mut self, steps: usize) {
        let end = now_unix();
        self.steps_done = steps;
        self.finished_unix = Some(end);
        self.finished_utc = Some(utc(end));
    }
}

fn provenance(exp: &Experiment, device: &str) -> Provenance {
    let crates = env!("ACPO_CRATE_VERSIONS")
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut hardware = BTreeMap::new();
    hardware.insert(
        "os".into(),
        format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
    );
    hardware.insert(
        "threads".into(),
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .to_string(),
    );
    if let Ok(m) = crate::files::read_to_string("/proc/meminfo") {
        if let Some(line) = m.lines().find(|l| l.starts_with("MemTotal")) {
            hardware.insert(
                "memory".into(),
                line.trim_start_matches("MemTotal:").trim().to_string(),
            );
        }
    }
    if let Ok(c) = crate::files::read_to_string("/proc/cpuinfo") {
        if let Some(line) = c.lines().find(|l| l.starts_with("model name")) {
            hardware.insert(
                "cpu".into(),
                line.split(':').nth(1).unwrap_or("").trim().to_string(),
            );
        }
    }
    hardware.insert("device".into(), device.into());
    let mut data = BTreeMap::new();
    match exp.data.suite {
        DataSuite::Real => {
            let d = &data::dapo::SPEC;
            data.insert(format!("{} v{}", d.file, d.version), d.sha256.to_string());
            for b in &exp.eval.benchmarks {
                let s = data::spec(*b);
                data.insert(format!("{} v{}", s.file, s.version), s.sha256.to_string());
            }
        }
        DataSuite::Synthetic => {
            data.insert(
                "synthetic task".into(),
                format!(
                    "v{} data seed {}",
                    data::synthetic::VERSION,
                    data::synthetic::DATA_SEED
                ),
            );
        }
    }
    let now = now_unix();
    Provenance {
        acpo_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: env!("ACPO_GIT_COMMIT").into(),
        crates,
        fingerprint: exp.fingerprint(),
        hardware,
        data,
        started_unix: now,
        started_utc: utc(now),
        finished_unix: None,
        finished_utc: None,
        steps_done: 0,
        engine: None,
        non_finite_metrics: BTreeMap::new(),
    }
}
