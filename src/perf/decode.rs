//! The decode attention's predicted time per shape, before a GPU times it: the bytes the
//! pipelined decode kernel (`kernels/flash_decode.cu`) must move for one layer of a decode step,
//! at each GPU's device copy rate measured in `results/gpu` (`acpo bench decode-predict
//! --measured results/gpu --doc docs/CUDA.md`). A decode step reads the KV cache once and does
//! about 2 FLOP a byte, so no kernel beats its bytes over the copy rate; the target is 80 % of
//! that rate. On a GPU, `kernels/check/flash_check.cu` prints each shape's time beside the same
//! count at the copy rate it measures there.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{call_order, files_named, write_report, PerfError, Result};
use crate::files::AtPath;
use crate::model::QwenConfig;
use crate::report::table::{Align::Left, Align::Right, Table};

/// Keys per chunk of the pipelined decode: each chunk writes one partial (m, l and D sums, f32)
/// per query head, which the row's last block reads back (through L2, in the same launch). `FDP_CHUNK` of kernels/launch.cuh (a
/// test holds them equal).
pub const CHUNK: usize = 128;

/// The share of the copy rate the kernel must reach (issue #57's target).
pub const TARGET: f64 = 0.8;

/// The shapes predicted, (sequences, keys a sequence): those `kernels/check/flash_check.cu`
/// times on a GPU (one row of 8,192 keys; 64 rows of 1,025 and 2,048), and 64 rows at the
/// paper's longest context (1,024 + 8,196 tokens).
pub const SHAPES: [(usize, usize); 4] = [(1, 8192), (64, 1025), (64, 2048), (64, 9220)];

/// The bytes one layer's decode attention moves at a shape, by what they are.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DecodeBytes {
    pub batch: usize,
    pub keys: usize,
    /// K and V, read once.
    pub kv: u64,
    /// Q read and O written.
    pub q_out: u64,
    /// The chunks' partials, written and read back.
    pub partials: u64,
    /// The valid bits, the first valid key and the rows' statistics.
    pub other: u64,
}

impl DecodeBytes {
    pub fn total(&self) -> u64 {
        self.kv + self.q_out + self.partials + self.other
    }
}

/// The bytes of one layer's decode attention for `batch` rows of `keys` keys in `elem` bytes a
/// value, with `cfg`'s heads.
pub fn bytes(cfg: &QwenConfig, batch: usize, keys: usize, elem: usize) -> DecodeBytes {
    let (h, kv, d) = (
        cfg.num_attention_heads as u64,
        cfg.num_key_value_heads as u64,
        cfg.head_dim() as u64,
    );
    let (b, s, e) = (batch as u64, keys as u64, elem as u64);
    let chunks = keys.div_ceil(CHUNK) as u64;
    DecodeBytes {
        batch,
        keys,
        kv: b * kv * s * d * e * 2,
        q_out: b * h * d * e * 2,
        partials: b * h * chunks * (2 + d) * 4 * 2,
        other: b * s + b * 4 + b * h * 8,
    }
}

/// [`bytes`] with an FP8 KV cache (`*_fp8` instances): K and V one byte a number, the query
/// and O in bf16, the partials as they are.
pub fn fp8_bytes(cfg: &QwenConfig, batch: usize, keys: usize) -> DecodeBytes {
    let b = bytes(cfg, batch, keys, 2);
    DecodeBytes { kv: b.kv / 2, ..b }
}

/// A GPU's measured device copy: `copy_gb_per_s` of the paper-shape `acpo bench generate`
/// (CUDA, bf16) in the last call of its latest run under `results/gpu`.
#[derive(Debug, Clone, Serialize)]
pub struct CopyRate {
    /// The run folder's device part, `NVIDIA-H200`.
    pub device: String,
    /// The report it comes from.
    pub source: PathBuf,
    pub gb_per_s: f64,
    /// The split-K kernel's (`flash_decode_split_*`) measured times at its shapes, where that
    /// run's `flash_kernels_check.log` timed it.
    pub split_k: Vec<SplitK>,
    /// The device's memory, where the run's `summary.txt` recorded it (`nvidia-smi`'s MiB).
    pub memory_bytes: Option<u64>,
}

/// One shape the split-K decode kernel was timed at (a `flash_check` line).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SplitK {
    /// Sequences, keys a sequence (the past and the new one), KV heads, head dim.
    pub batch: usize,
    pub keys: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ms: f64,
}

impl SplitK {
    /// The bytes of K and V (bf16) it read once: what its rate against the copy rate counts.
    pub fn kv_bytes(&self) -> f64 {
        (self.batch * self.keys * self.kv_heads * self.head_dim * 2 * 2) as f64
    }

    /// Whether it is `cfg`'s decode attention at `batch` × `keys`.
    pub fn is(&self, cfg: &QwenConfig, batch: usize, keys: usize) -> bool {
        (self.batch, self.keys, self.kv_heads, self.head_dim)
            == (batch, keys, cfg.num_key_value_heads, cfg.head_dim())
    }
}

impl CopyRate {
    /// `H200` of `NVIDIA-H200`, `H100` of `NVIDIA-H100-80GB-HBM3`.
    pub fn label(&self) -> &str {
        let d = self.device.strip_prefix("NVIDIA-").unwrap_or(&self.device);
        d.split('-').next().unwrap_or(d)
    }
}

/// The copy rate of a `generate.json` (CUDA, bf16, with a roofline), if it has one.
fn copy_of(path: &Path) -> Result<Option<f64>> {
    let text = crate::files::read_to_string(path).at(path)?;
    let rows: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| PerfError::Shape(format!("{}: not JSON: {e}", path.display())))?;
    Ok(rows.as_array().and_then(|rows| {
        rows.iter()
            .filter(|r| r["target"] == "cuda/bf16")
            .find_map(|r| r["roofline"]["copy_gb_per_s"].as_f64())
    }))
}

/// The device memory a GPU run recorded: the first `summary.txt` line of the suite's header,
/// `== suite on NVIDIA H200, 580.159.04, 143771 MiB` (or a section's, `== section … on …`).
fn memory_of(run: &Path) -> Result<Option<u64>> {
    let mut summaries = files_named(run, "summary.txt")?;
    summaries.sort_by_cached_key(|p| call_order(p));
    for summary in summaries {
        let text = crate::files::read_to_string(&summary).at(&summary)?;
        if let Some(bytes) = memory_in(&text) {
            return Ok(Some(bytes));
        }
    }
    Ok(None)
}

/// The device memory in bytes that the first suite header line of `text` names, if any
/// (`== suite on NVIDIA H200, 580.159.04, 143771 MiB`).
pub(super) fn memory_in(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let header = l.strip_prefix("== ")?;
        if !header.contains(" on ") {
            return None;
        }
        let last = header.rsplit(", ").next()?;
        let mib = last.strip_suffix(" MiB")?.trim().parse::<u64>().ok()?;
        mib.checked_mul(1 << 20)
    })
}

/// The split-K decode's timings in a `flash_kernels_check.log`: lines
/// `time decode   B64 H16 KV8 T1 past1024 D128: forward 0.341 ms, …` (B, past + 1 keys, KV, D).
fn split_k_times(path: &Path) -> Result<Vec<SplitK>> {
    let text = crate::files::read_to_string(path).at(path)?;
    let num = |field: &str, prefix: &str| field.strip_prefix(prefix)?.parse::<usize>().ok();
    Ok(text
        .lines()
        .filter_map(|l| {
            // the split-K kernel's name is `decode` alone: `time decode pipe …` and `… pipe fp8 …`
            // are the pipelined kernel's lines
            let rest = l.strip_prefix("time decode ")?.trim_start();
            if !rest.starts_with('B') {
                return None;
            }
            let (shape, times) = rest.split_once(": forward ")?;
            let fields: Vec<&str> = shape.split_whitespace().collect();
            let field = |prefix: &str| fields.iter().find_map(|f| num(f, prefix));
            let ms = times.split_once(" ms")?.0.parse::<f64>().ok()?;
            Some(SplitK {
                batch: field("B")?,
                keys: field("past")? + 1,
                kv_heads: field("KV")?,
                head_dim: field("D")?,
                ms,
            })
        })
        .collect())
}

/// Each GPU's copy rate under `measured` (`results/gpu/<device>-<yyyymmdd>/<call>/…`): the
/// latest run of each device, the last of its calls with a paper-shape generate report; its
/// split-K timings from the latest of the device's runs that has them.
pub fn copy_rates(measured: &Path) -> Result<Vec<CopyRate>> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(measured)
        .at(measured)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    runs.sort();
    let mut rates: Vec<(String, CopyRate)> = Vec::new();
    for run in runs {
        let name = run.file_name().map(|n| n.to_string_lossy().into_owned());
        let Some((device, date)) = name.as_deref().and_then(|n| n.rsplit_once('-')) else {
            continue;
        };
        if date.len() != 8 || !date.bytes().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let mut reports = files_named(&run, "generate.json")?;
        reports.retain(|p| p.components().any(|c| c.as_os_str() == "generate-paper"));
        reports.sort_by_cached_key(|p| call_order(p));
        let mut found = None;
        for report in reports.iter().rev() {
            if let Some(rate) = copy_of(report)? {
                found = Some((report.clone(), rate));
                break;
            }
        }
        let Some((source, gb_per_s)) = found else {
            continue;
        };
        let mut logs = files_named(&run, "flash_kernels_check.log")?;
        logs.sort_by_cached_key(|p| call_order(p));
        let mut split_k = Vec::new();
        for log in logs.iter().rev() {
            split_k = split_k_times(log)?;
            if !split_k.is_empty() {
                break;
            }
        }
        let rate = CopyRate {
            device: device.to_owned(),
            source,
            gb_per_s,
            split_k,
            memory_bytes: memory_of(&run)?,
        };
        match rates.iter_mut().find(|(_, r)| r.device == device) {
            Some(slot) if slot.0.as_str() < date => {
                // a later run whose flash_check timed no split-K kernel (cut by its call's
                // time) keeps the device's earlier timings of it: the same kernel on the same
                // GPU, the reference its prediction sets beside the pipelined kernel's
                let mut rate = rate;
                if rate.split_k.is_empty() {
                    rate.split_k = std::mem::take(&mut slot.1.split_k);
                }
                *slot = (date.to_owned(), rate)
            }
            Some(_) => {}
            None => rates.push((date.to_owned(), rate)),
        }
    }
    if rates.is_empty() {
        return Err(PerfError::Shape(format!(
            "{}: no GPU run with a measured copy rate (<device>-<yyyymmdd>/…/generate-paper/generate.json, CUDA bf16)",
            measured.display()
        )));
    }
    rates.sort_by(|a, b| a.1.device.cmp(&b.1.device));
    Ok(rates.into_iter().map(|(_, r)| r).collect())
}

/// One shape's prediction on one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct DecodePredicted {
    pub bytes: DecodeBytes,
    pub device: String,
    pub copy_gb_per_s: f64,
    /// The bytes over the copy rate.
    pub seconds: f64,
    /// The most time that still meets the target ([`TARGET`] of the copy rate).
    pub target_seconds: f64,
    /// The same over an FP8 KV cache ([`fp8_bytes`]), and its most time at the target.
    pub fp8_seconds: f64,
    pub fp8_target_seconds: f64,
}

/// The predictions of [`SHAPES`] with `cfg`'s heads in bf16 on each GPU of `rates`.
pub fn predict(cfg: &QwenConfig, rates: &[CopyRate]) -> Vec<DecodePredicted> {
    SHAPES
        .iter()
        .flat_map(|&(batch, keys)| {
            let bytes = bytes(cfg, batch, keys, 2);
            let fp8 = fp8_bytes(cfg, batch, keys);
            rates.iter().map(move |r| {
                let seconds = bytes.total() as f64 / (r.gb_per_s * 1e9);
                let fp8_seconds = fp8.total() as f64 / (r.gb_per_s * 1e9);
                DecodePredicted {
                    bytes,
                    device: r.device.clone(),
                    copy_gb_per_s: r.gb_per_s,
                    seconds,
                    target_seconds: seconds / TARGET,
                    fp8_seconds,
                    fp8_target_seconds: fp8_seconds / TARGET,
                }
            })
        })
        .collect()
}

fn micros(s: f64) -> String {
    format!("{:.1} µs", s * 1e6)
}

pub(super) fn thousands(x: f64) -> String {
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn markdown(cfg: &QwenConfig, model: &str, rates: &[CopyRate], rows: &[DecodePredicted]) -> String {
    let mut cols: Vec<(String, _)> = vec![
        ("sequences × keys".to_owned(), Left),
        ("MB moved".to_owned(), Right),
        ("of them K/V".to_owned(), Right),
    ];
    for r in rates {
        cols.push((
            format!(
                "{} at {} GB/s (≥ 80 %: at most)",
                r.label(),
                thousands(r.gb_per_s)
            ),
            Right,
        ));
    }
    for r in rates {
        cols.push((format!("{}: 28 layers", r.label()), Right));
    }
    for r in rates {
        cols.push((format!("FP8 cache, {} (≥ 80 %: at most)", r.label()), Right));
    }
    for r in rates.iter().filter(|r| !r.split_k.is_empty()) {
        cols.push((format!("split-K kernel measured, {}", r.label()), Right));
    }
    let mut t = Table::new(cols);
    for &(batch, keys) in &SHAPES {
        let of_shape: Vec<&DecodePredicted> = rows
            .iter()
            .filter(|p| p.bytes.batch == batch && p.bytes.keys == keys)
            .collect();
        let Some(first) = of_shape.first() else {
            continue;
        };
        let b = first.bytes;
        let mut cells = vec![
            format!("{batch} × {}", thousands(keys as f64)),
            format!("{:.1}", b.total() as f64 / 1e6),
            format!("{:.1} %", 100.0 * b.kv as f64 / b.total() as f64),
        ];
        for p in &of_shape {
            cells.push(format!(
                "{} ({})",
                micros(p.seconds),
                micros(p.target_seconds)
            ));
        }
        for p in &of_shape {
            cells.push(format!(
                "{:.2} ms",
                p.seconds * cfg.num_hidden_layers as f64 * 1e3
            ));
        }
        for p in &of_shape {
            cells.push(format!(
                "{} ({})",
                micros(p.fp8_seconds),
                micros(p.fp8_target_seconds)
            ));
        }
        for r in rates.iter().filter(|r| !r.split_k.is_empty()) {
            cells.push(r.split_k.iter().find(|k| k.is(cfg, batch, keys)).map_or(
                "—".to_owned(),
                |k| {
                    format!(
                        "{} µs ({:.0} % of the copy rate)",
                        thousands(k.ms * 1e3),
                        100.0 * b.total() as f64 / (k.ms * 1e-3) / (r.gb_per_s * 1e9)
                    )
                },
            ));
        }
        t.row(cells);
    }
    let sources: Vec<String> = rates
        .iter()
        .map(|r| format!("{} `{}`", r.label(), r.source.display()))
        .collect();
    format!(
        "**Predicted, not measured.** One layer's decode attention of {model} ({} query heads over {} KV heads, head dim {}, bf16) by the pipelined kernel (`kernels/flash_decode.cu`), from the bytes it must move: K and V once, Q in and O out, each chunk of {CHUNK} keys' partial per query head written and read back by the row's last block (one launch a layer), the valid bits and the statistics; at each GPU's measured device copy (`copy_gb_per_s`: {}). `acpo bench decode-predict` (`perf::decode`) writes it. The target (issue #57) is {:.0} % of the copy rate: the time in brackets. The split-K kernel it replaces, where a run timed it (`flash_kernels_check.log`), is set beside; the runs so far timed it with a `cudaMalloc` and a `cudaFree` of its partials in each call (`flash_check` now keeps the buffer). `kernels/check/flash_check.cu` on a GPU times the pipelined kernel at the first three shapes beside this count at the copy rate it measures there, and its FP8 instance beside the count with K and V at one byte a number (the FP8 columns: an FP8 KV cache, `--kv-cache fp8`, the query and O still bf16).\n\n{t}",
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
        sources.join(", "),
        TARGET * 100.0,
    )
}

/// Writes `decode-predicted.{json,md}` under `out`: the decode attention's predicted times of
/// `model` (its config `cfg`) at each GPU's copy rate in `rates` (`acpo bench decode-predict`,
/// [`super::decode_predict`]).
pub fn write(cfg: &QwenConfig, model: &str, rates: &[CopyRate], out: &Path) -> Result<PathBuf> {
    let rows = predict(cfg, rates);
    let json =
        serde_json::to_string_pretty(&(rates, &rows)).expect("invariant: the prediction is JSON");
    write_report(out, "decode-predicted.json", json.as_bytes())?;
    write_report(
        out,
        "decode-predicted.md",
        markdown(cfg, model, rates, &rows).as_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3_17b() -> QwenConfig {
        QwenConfig::load(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("experiments/paper/configs/qwen3-1.7b.json"),
        )
        .expect("the committed config")
    }

    /// An FP8 cache halves K and V and nothing else.
    #[test]
    fn an_fp8_cache_halves_the_keys_and_values_only() {
        let (b, f) = (
            bytes(&qwen3_17b(), 64, 1025, 2),
            fp8_bytes(&qwen3_17b(), 64, 1025),
        );
        assert_eq!(f.kv, 64 * 8 * 1025 * 128 * 2);
        assert_eq!(
            (f.q_out, f.partials, f.other),
            (b.q_out, b.partials, b.other)
        );
    }

    /// The chunk the bytes count is the kernel's.
    #[test]
    fn chunk_is_the_kernels() {
        let header = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/launch.cuh"),
        )
        .expect("launch.cuh");
        assert!(
            header.contains(&format!("#define FDP_CHUNK {CHUNK}\n")),
            "perf::decode::CHUNK is not launch.cuh's FDP_CHUNK"
        );
    }

    /// 64 rows of 1,025 keys with Qwen3-1.7B's heads: K and V are 64 · 8 · 1,025 · 128 · 2 · 2
    /// bytes, the partials 64 · 16 · 9 chunks · 130 · 4 · 2.
    #[test]
    fn bytes_of_a_batch() {
        let b = bytes(&qwen3_17b(), 64, 1025, 2);
        assert_eq!(b.kv, 64 * 8 * 1025 * 128 * 2 * 2);
        assert_eq!(b.q_out, 64 * 16 * 128 * 2 * 2);
        assert_eq!(b.partials, 64 * 16 * 9 * 130 * 4 * 2);
        assert_eq!(b.other, 64 * 1025 + 64 * 4 + 64 * 16 * 8);
        let rate = CopyRate {
            device: "NVIDIA-H200".into(),
            source: PathBuf::new(),
            gb_per_s: 1000.0,
            split_k: vec![],
            memory_bytes: None,
        };
        let p = predict(&qwen3_17b(), std::slice::from_ref(&rate));
        let row = p.iter().find(|p| p.bytes.keys == 1025).expect("the shape");
        assert!((row.seconds - b.total() as f64 / 1e12).abs() < 1e-15);
        assert!((row.target_seconds - row.seconds / 0.8).abs() < 1e-15);
        assert_eq!(rate.label(), "H200");
    }

    /// A device's latest run gives its copy rate and memory; where that run's flash_check timed
    /// no split-K kernel (cut), the timings come from its run before.
    #[test]
    fn a_later_run_without_split_k_timings_keeps_the_earlier_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = |name: &str, copy: f64, log: Option<&str>| {
            let at = dir.path().join(name).join("1-suite/gpu-suite");
            std::fs::create_dir_all(at.join("generate-paper")).expect("mkdir");
            std::fs::write(
                at.join("generate-paper/generate.json"),
                format!(r#"[{{"target": "cuda/bf16", "roofline": {{"copy_gb_per_s": {copy}}}}}]"#),
            )
            .expect("w");
            std::fs::write(
                at.join("summary.txt"),
                "== suite on NVIDIA H200, 580.1, 143771 MiB\n",
            )
            .expect("w");
            if let Some(log) = log {
                std::fs::write(at.join("flash_kernels_check.log"), log).expect("w");
            }
        };
        let timed =
            "time decode   B64 H16 KV8 T1 past1024 D128: forward 0.341 ms, 790 GB/s (K/V once)\n";
        run("NVIDIA-H200-20261126", 3773.0, Some(timed));
        run("NVIDIA-H200-20261201", 3800.0, Some("flash check cut\n"));
        let rates = copy_rates(dir.path()).expect("rates");
        assert_eq!(rates.len(), 1);
        assert_eq!(rates[0].gb_per_s, 3800.0);
        assert_eq!(rates[0].memory_bytes, Some(143_771 << 20));
        assert_eq!(rates[0].split_k.len(), 1);
        assert_eq!(rates[0].split_k[0].ms, 0.341);
    }

    #[test]
    fn split_k_lines_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("flash_kernels_check.log");
        std::fs::write(
            &log,
            "decode       B3 H14 ok\ntime decode   B64 H16 KV8 T1 past1024 D128: forward 0.341 ms, 790 GB/s (K/V once), 1.6 TFLOP/s\ntime mma fwd  B2 H16 KV8 T2048 past0 D128: forward 0.330 ms, 1 GB/s\ntime decode pipe B64 H16 KV8 T1 past1024 D128: forward 0.1000 ms, 2800 GB/s (K/V once), 5.4 TFLOP/s\ntime decode pipe fp8 B64 H16 KV8 T1 past1024 D128: forward 0.0500 ms, 2800 GB/s (K/V once)\n",
        )
        .expect("write");
        let want = SplitK {
            batch: 64,
            keys: 1025,
            kv_heads: 8,
            head_dim: 128,
            ms: 0.341,
        };
        assert_eq!(split_k_times(&log).expect("read"), vec![want]);
        assert_eq!(want.kv_bytes(), (64 * 1025 * 8 * 128 * 4) as f64);
    }
}
