//! The tensor-core attention's predicted time per shape, before a GPU times it (`acpo bench
//! attention-predict --measured results/gpu --doc docs/CUDA.md`): one layer's causal attention,
//! forward and backward (`kernels/flash_mma.cu`), from a cost model fitted to the kernels a GPU
//! last timed (`flash_kernels_check.log`).
//!
//! The model. The kernels walk units of 64 rows × 64 columns (a warp set's 16-row slices of a
//! tile); a unit costs `p` per tensor-core product (a 64 × 64 × D matrix product) plus `o` per
//! tile a block loads (the cp.async copy, its wait and barrier, the softmax bookkeeping). The
//! timed forward did 2 products a unit, the backward 7 (dQ 3, dK/dV 4) over two walks of the
//! same units, so `fwd = N (2p + o)` and `bwd = N (7p + 2o)` give `N p` and `N o` at each shape.
//! A forward or dQ block of 128 query rows loads each K/V tile once for two units, and so does a
//! dK/dV block of 128 keys with each Q/dO tile: their loads, hence their `o`, are counted by tile
//! loads. A backward in 5 products (one walk of 128-key blocks, dQ accumulated in order) is
//! `N (5p + o')` with `o'` dK/dV's: a floor, as it ignores the dQ accumulation's traffic. Beside them, the
//! floors no kernel beats: the FLOPs at the tensor cores' dense bf16 peak and the bytes each
//! kernel must move once at the measured device copy.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::decode::{copy_rates, CopyRate};
use super::{write_report, PerfError, Result};
use crate::files::AtPath;
use crate::model::QwenConfig;
use crate::report::table::{Align::Left, Align::Right, Table};

/// Columns of a tile (keys for the forward and dQ, query rows for dK/dV): `FM_COLS`.
pub const TILE: usize = 64;
/// Rows of the timed (version 3) kernels' blocks, as head dim 64's still are (4 warps of 16).
pub const ROWS_V3: usize = 64;
/// Query rows of a forward or dQ block at head dim 128 now: `fm_fwd_rows(128)` (8 warps of 16).
pub const FWD_ROWS_D128: usize = 128;
/// Keys of a dK/dV block at head dim 128 now: `fm_dkdv_rows(128)` (8 warps of 16).
pub const DKDV_ROWS_D128: usize = 128;
/// The tensor cores' dense bf16 peak of an H100 or H200 SXM (the same SMs and clocks), FLOP/s.
pub const PEAK_BF16: f64 = 989.4e12;
/// The shapes predicted, (sequences, tokens a sequence): those `kernels/check/flash_check.cu`
/// times on a GPU and the (2 × 2,048 and 2 × 9,220).
pub const SHAPES: [(usize, usize); 2] = [(2, 2048), (2, 9220)];

/// The blocks × key tiles a causal forward over `t` query rows walks in blocks of `rows`
/// (no padding, no cached prefix): the tile loads of one head.
pub fn tile_loads(t: usize, rows: usize) -> u64 {
    (0..t.div_ceil(rows))
        .map(|r| (t.min((r + 1) * rows)).div_ceil(TILE) as u64)
        .sum()
}

/// The blocks × query tiles a causal dK/dV walks over `t` keys and query rows in blocks of
/// `rows` keys: a block starting at key k0 reads the query tiles from the one holding row k0.
pub fn key_tile_loads(t: usize, rows: usize) -> u64 {
    (0..t.div_ceil(rows))
        .map(|kb| (t - kb * rows / TILE * TILE).div_ceil(TILE) as u64)
        .sum()
}

/// The bytes the 5-product backward's ordered adds move (kernels/flash_mma.cu, `flash_dkdvq_*`):
/// each key block (as many keys as the head dim, as the fused kernel's layout has it) reads and
/// writes, for every query head of its KV head, an f32 tile of 64 query rows × `d` for each
/// query tile it visits ([`key_tile_loads`]). Whole tiles: the last, partial one's rows past
/// T are counted too (about 1 % at 2 × 9,220).
pub fn dq_add_bytes(batch: usize, heads: usize, d: usize, t: usize) -> f64 {
    let visits = (batch * heads) as f64 * key_tile_loads(t, d) as f64;
    visits * (TILE * d) as f64 * 4.0 * 2.0
}

/// The bytes the 5-product backward allocates for one layer's backward on CUDA
/// (`src/fused/flash/cuda.rs`, `five_products`): dQ's f32 sums (B·H·T·D) and an i32 counter per
/// (sequence, query head, tile of [`TILE`] query rows) with the blocks' ticket after them.
pub fn five_product_scratch(batch: usize, heads: usize, d: usize, t: usize) -> u64 {
    let sums = (batch * heads * t * d) as u64 * 4;
    let counters = (batch * heads * t.div_ceil(TILE) + 1) as u64 * 4;
    sums + counters
}

/// FLOPs of one layer's causal attention as FA2 counts them: the forward 4·B·H·D·T²/2, the
/// backward 2.5× that.
pub fn flops_fwd(batch: usize, heads: usize, d: usize, t: usize) -> f64 {
    4.0 * batch as f64 * heads as f64 * d as f64 * (t as f64) * (t as f64) / 2.0
}

/// The bytes a forward and a backward must move at least (bf16 operands, f32 statistics): the
/// forward reads Q, K, V and writes O and (m, 1/l); the backward reads Q, K, V, O, dO and the
/// statistics and writes dQ, dK, dV (and δ, written and read).
pub fn min_bytes(cfg: &QwenConfig, batch: usize, t: usize) -> (f64, f64) {
    let (h, kv, d) = (
        cfg.num_attention_heads as f64,
        cfg.num_key_value_heads as f64,
        cfg.head_dim() as f64,
    );
    let (b, t) = (batch as f64, t as f64);
    let q = b * h * t * d * 2.0;
    let k = b * kv * t * d * 2.0;
    let rows = b * h * t;
    let fwd = 2.0 * q + 2.0 * k + rows * 8.0;
    let bwd = 3.0 * q + 2.0 * k + q + 2.0 * k + rows * (8.0 + 4.0 * 2.0);
    (fwd, bwd)
}

/// The version 3 kernels timed at a shape: milliseconds of the forward and of the backward
/// (δ, dQ, dK/dV), from a `flash_kernels_check.log` line
/// `time mma fwd  B2 H16 KV8 T9220 past0 D128: forward 5.015 ms, …; backward 13.614 ms, …`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Timed {
    pub batch: usize,
    pub heads: usize,
    pub kv: usize,
    pub t: usize,
    pub d: usize,
    pub fwd_ms: f64,
    pub bwd_ms: f64,
}

/// Every `time mma` line of a flash_check log with a forward and a backward and no cached
/// prefix.
pub fn timed_lines(text: &str) -> Vec<Timed> {
    let num = |field: &str, prefix: &str| field.strip_prefix(prefix)?.parse::<usize>().ok();
    let ms = |s: &str, label: &str| -> Option<f64> {
        s.split_once(label)?
            .1
            .trim_start()
            .split_once(" ms")?
            .0
            .parse()
            .ok()
    };
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("time mma fwd ")?.trim_start();
            let (shape, times) = rest.split_once(": ")?;
            let f: Vec<&str> = shape.split_whitespace().collect();
            let get = |p: &str| f.iter().find_map(|x| num(x, p));
            (get("past")? == 0).then_some(())?;
            Some(Timed {
                batch: get("B")?,
                heads: get("H")?,
                kv: get("KV")?,
                t: get("T")?,
                d: get("D")?,
                fwd_ms: ms(times, "forward ")?,
                bwd_ms: ms(times, "backward ")?,
            })
        })
        .collect()
}

/// The timed kernels of the latest run under `measured` that timed them: (its log, its lines).
pub fn timed(measured: &Path) -> Result<(PathBuf, Vec<Timed>)> {
    let mut logs = super::files_named(measured, "flash_kernels_check.log")?;
    // Run folders are named <device>-<yyyymmdd>: the latest is the latest date, whatever the
    // device (a plain path sort would order by the device's name first), then the last call.
    logs.sort_by_cached_key(|p| (run_date(p).map(str::to_owned), super::call_order(p)));
    for log in logs.iter().rev() {
        let lines = timed_lines(&crate::files::read_to_string(log).at(log)?);
        if !lines.is_empty() {
            return Ok((log.clone(), lines));
        }
    }
    Err(PerfError::Shape(format!(
        "{}: no flash_kernels_check.log with a `time mma fwd` line",
        measured.display()
    )))
}

/// The date of the run folder holding `log`: the suffix of the innermost folder named
/// `<anything>-<yyyymmdd>`, or None (ordered first) where no folder is named so.
fn run_date(log: &Path) -> Option<&str> {
    log.parent()?.components().rev().find_map(|c| {
        let name = c.as_os_str().to_str()?;
        let (_, date) = name.rsplit_once('-')?;
        (date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit())).then_some(date)
    })
}

/// One shape's prediction (milliseconds; TFLOP/s counted FA2's way).
#[derive(Debug, Clone, Serialize)]
pub struct AttentionPredicted {
    pub batch: usize,
    pub t: usize,
    /// FA2's count, forward + backward.
    pub flops: f64,
    pub measured: Timed,
    /// The fitted model: N·p (one product over every unit) and N·o (one tile load a unit).
    pub np_ms: f64,
    pub no_ms: f64,
    /// The forward in 128-row blocks, and with the backward (dQ in 128-row blocks, dK/dV in
    /// 128-key blocks).
    pub fwd_ms: f64,
    pub fwd_bwd_ms: f64,
    /// The forward in 128-row blocks with a 5-product backward in 128-key blocks (a floor: the
    /// dQ accumulation's traffic is not counted).
    pub fwd_bwd5_ms: f64,
    /// The 5-product backward's ordered adds of dQ ([`dq_add_bytes`]), and the floor above with
    /// them moved at each GPU's copy rate (label, ms): what it costs if none stays in L2.
    pub dq_add_bytes: f64,
    pub fwd_bwd5_adds_ms: Vec<(String, f64)>,
    /// FA2's FLOPs at [`PEAK_BF16`].
    pub peak_ms: f64,
    /// The bytes forward + backward must move, and their time at each GPU's copy rate
    /// (label, ms).
    pub bytes: f64,
    pub bytes_ms: Vec<(String, f64)>,
}

/// The predictions of [`SHAPES`] with `cfg`'s heads at head dim 128, from the timed lines of
/// the same shapes.
pub fn predict(
    cfg: &QwenConfig,
    timed: &[Timed],
    rates: &[CopyRate],
) -> Result<Vec<AttentionPredicted>> {
    let (h, kv, d) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
    );
    if d != 128 {
        return Err(PerfError::Shape(format!(
            "attention-predict models head dim 128 (128-row forward blocks), not {d}"
        )));
    }
    SHAPES
        .iter()
        .map(|&(batch, t)| {
            let m = *timed
                .iter()
                .find(|x| x.batch == batch && x.t == t && x.heads == h && x.kv == kv && x.d == d)
                .ok_or_else(|| {
                    PerfError::Shape(format!(
                        "no timed mma kernels at B{batch} H{h} KV{kv} T{t} D{d} to fit the model to"
                    ))
                })?;
            let np = (m.bwd_ms - 2.0 * m.fwd_ms) / 3.0;
            let no = m.fwd_ms - 2.0 * np;
            if np <= 0.0 || no < 0.0 {
                return Err(PerfError::Shape(format!(
                    "the timed kernels at B{batch} T{t} do not fit the model (N·p {np:.3} ms, N·o {no:.3} ms)"
                )));
            }
            let loads = tile_loads(t, FWD_ROWS_D128) as f64 / tile_loads(t, ROWS_V3) as f64;
            let loads_k =
                key_tile_loads(t, DKDV_ROWS_D128) as f64 / key_tile_loads(t, ROWS_V3) as f64;
            let fwd = 2.0 * np + no * loads;
            let f = flops_fwd(batch, h, d, t);
            let (bf, bb) = min_bytes(cfg, batch, t);
            let fwd_bwd5 = fwd + 5.0 * np + no * loads_k;
            let adds = dq_add_bytes(batch, h, d, t);
            let at_copy = |bytes: f64| -> Vec<(String, f64)> {
                rates
                    .iter()
                    .map(|r| (r.label().to_owned(), bytes / (r.gb_per_s * 1e9) * 1e3))
                    .collect()
            };
            Ok(AttentionPredicted {
                batch,
                t,
                flops: 3.5 * f,
                measured: m,
                np_ms: np,
                no_ms: no,
                fwd_ms: fwd,
                fwd_bwd_ms: fwd + m.bwd_ms - no * (1.0 - loads) - no * (1.0 - loads_k),
                fwd_bwd5_ms: fwd_bwd5,
                dq_add_bytes: adds,
                fwd_bwd5_adds_ms: at_copy(adds)
                    .into_iter()
                    .map(|(label, ms)| (label, fwd_bwd5 + ms))
                    .collect(),
                peak_ms: 3.5 * f / PEAK_BF16 * 1e3,
                bytes: bf + bb,
                bytes_ms: at_copy(bf + bb),
            })
        })
        .collect()
}

fn at(ms: f64, flops: f64) -> String {
    format!("{ms:.2} ms ({:.0})", flops / (ms * 1e-3) / 1e12)
}

fn markdown(model: &str, log: &Path, rows: &[AttentionPredicted]) -> String {
    let mut cols = vec![
        ("B × T".to_owned(), Left),
        ("GFLOP (FA2's count)".to_owned(), Right),
        ("timed v3: fwd / bwd".to_owned(), Right),
        ("N·p / N·o".to_owned(), Right),
        ("fwd, 128-row blocks".to_owned(), Right),
        ("fwd + bwd, 128-row blocks".to_owned(), Right),
        ("fwd + 5-product bwd (floor)".to_owned(), Right),
    ];
    if let Some(first) = rows.first() {
        for (label, _) in &first.fwd_bwd5_adds_ms {
            cols.push((format!("with its dQ adds at the {label}'s copy"), Right));
        }
    }
    cols.push(("at the bf16 peak".to_owned(), Right));
    if let Some(first) = rows.first() {
        for (label, _) in &first.bytes_ms {
            cols.push((format!("bytes at the {label}'s copy"), Right));
        }
    }
    let mut t = Table::new(cols);
    for r in rows {
        let f_fwd = r.flops / 3.5;
        let mut cells = vec![
            format!("{} × {}", r.batch, super::decode::thousands(r.t as f64)),
            format!("{:.0}", r.flops / 1e9),
            format!("{:.3} / {:.3} ms", r.measured.fwd_ms, r.measured.bwd_ms),
            format!("{:.3} / {:.3} ms", r.np_ms, r.no_ms),
            at(r.fwd_ms, f_fwd),
            at(r.fwd_bwd_ms, r.flops),
            at(r.fwd_bwd5_ms, r.flops),
        ];
        for (_, ms) in &r.fwd_bwd5_adds_ms {
            cells.push(at(*ms, r.flops));
        }
        cells.push(at(r.peak_ms, r.flops));
        for (_, ms) in &r.bytes_ms {
            cells.push(format!("{ms:.3} ms"));
        }
        t.row(cells);
    }
    format!(
        "**Predicted, not measured.** One layer's causal attention of {model} (head dim 128, bf16, no padding) on the tensor-core kernels (`kernels/flash_mma.cu`), milliseconds and, in brackets, TFLOP/s counted FA2's way (forward 4·B·H·D·T²/2, backward 2.5× that). The model (`perf::flash_predict`, `acpo bench attention-predict`) is fitted to the version 3 kernels' times in `{}`: a 64 × 64 unit costs p per tensor-core product and o per tile load, the timed forward 2 products a unit and the backward 7 over two walks, so N·p and N·o follow at each shape; the forward and dQ in 128-row blocks load each K/V tile once for two units, dK/dV in 128-key blocks each Q/dO tile (each kernel's o scaled by its tile loads), and a 5-product backward would be one walk of dK/dV's, N·(5p + o) (a floor: its dQ accumulation's traffic is not counted), then with that traffic at each GPU's copy rate (every 128-key block reading and writing an f32 64-row tile of dQ per query head for each query tile it visits, `perf::flash_predict::dq_add_bytes`: the cost if none of it stays in L2). The H100 and H200 have the same SMs and clocks, so one prediction serves both; the last columns are the floors no kernel beats: the FLOPs at the 989.4 TFLOP/s dense bf16 peak and the bytes forward + backward must move once at each GPU's measured copy (perf::decode's rates). Issue #59's target is ≥ 200 TFLOP/s forward + backward at 2 × 9,220.\n\n{t}",
        log.display(),
    )
}

/// `acpo bench attention-predict`: the model fitted to the latest timed kernels under
/// `measured`, with the config `target`'s heads; writes `attention-predicted.{json,md}` under
/// `out`.
pub fn attention_predict(measured: &Path, target: &Path, out: &Path) -> Result<PathBuf> {
    let (log, lines) = timed(measured)?;
    let rates = copy_rates(measured)?;
    let cfg = QwenConfig::load(target)?;
    let rows = predict(&cfg, &lines, &rates)?;
    let json = serde_json::to_string_pretty(&rows).expect("invariant: the prediction is JSON");
    write_report(out, "attention-predicted.json", json.as_bytes())?;
    let model = target
        .file_stem()
        .map_or("the model".into(), |s| s.to_string_lossy());
    write_report(
        out,
        "attention-predicted.md",
        markdown(&model, &log, &rows).as_bytes(),
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

    /// The tile and block sizes the model counts are the kernels'.
    #[test]
    fn sizes_are_the_kernels() {
        let header = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/launch.cuh"),
        )
        .expect("launch.cuh");
        for line in [
            format!("#define FM_COLS {TILE}\n"),
            format!("#define FM_FWD_WARPS_D64 {}\n", ROWS_V3 / 16),
            format!("#define FM_FWD_WARPS_D128 {}\n", FWD_ROWS_D128 / 16),
            format!("#define FM_DKDV_WARPS_D128 {}\n", DKDV_ROWS_D128 / 16),
        ] {
            assert!(
                header.contains(&line),
                "launch.cuh has no `{}`",
                line.trim()
            );
        }
    }

    /// A 130-row head in 64-row blocks loads 1 + 2 + 3 tiles; in 128-row blocks 2 + 3.
    #[test]
    fn tile_loads_count_causal_blocks() {
        assert_eq!(tile_loads(130, 64), 6);
        assert_eq!(tile_loads(130, 128), 5);
        assert_eq!(tile_loads(64, 64), 1);
        // 130 keys in 64-key blocks read 3 + 2 + 1 query tiles; in 128-key blocks 3 + 1
        assert_eq!(key_tile_loads(130, 64), 6);
        assert_eq!(key_tile_loads(130, 128), 4);
    }

    /// The fit reproduces the timed kernels it was fitted to: 2p + o is the forward and 7p + 2o
    /// the backward; 128-row blocks save tile loads, never products.
    #[test]
    fn the_model_reproduces_its_fit() {
        let m = Timed {
            batch: 2,
            heads: 16,
            kv: 8,
            t: 9220,
            d: 128,
            fwd_ms: 5.015,
            bwd_ms: 13.614,
        };
        let small = Timed {
            t: 2048,
            fwd_ms: 0.330,
            bwd_ms: 0.964,
            ..m
        };
        let rows = predict(&qwen3_17b(), &[m, small], &[]).expect("fits");
        let r = &rows[1];
        assert!((2.0 * r.np_ms + r.no_ms - 5.015).abs() < 1e-12);
        assert!((7.0 * r.np_ms + 2.0 * r.no_ms - 13.614).abs() < 1e-12);
        assert!(r.fwd_ms < 5.015 && r.fwd_ms > 2.0 * r.np_ms);
        // dQ saves the forward's tile loads, dK/dV nearly as many
        let saved_fwd = 5.015 - r.fwd_ms;
        let saved_bwd = 13.614 + r.fwd_ms - r.fwd_bwd_ms;
        assert!(saved_bwd > 1.9 * saved_fwd && saved_bwd < 2.1 * saved_fwd);
        assert!(r.fwd_bwd5_ms < r.fwd_bwd_ms);
        // the ordered adds at 2 × 9,220: 73 key blocks visit 145 − 2·kb query tiles each,
        // 5,329 a query head, 32 heads of 64 × 128 f32 read and written (kernels/NOTES.md v8)
        assert_eq!(
            dq_add_bytes(2, 16, 128, 9220),
            32.0 * 5329.0 * 64.0 * 128.0 * 8.0
        );
        assert!(r.fwd_bwd5_adds_ms.is_empty(), "no copy rates given");
        assert!((r.flops - 3.5 * 4.0 * 2.0 * 16.0 * 128.0 * 9220.0 * 9220.0 / 2.0).abs() < 1.0);
        let none = predict(&qwen3_17b(), &[m], &[]);
        assert!(none.is_err(), "a shape without timings is an error");
    }

    /// The latest run is the latest date in its folder's name, not the last device name: an
    /// older h200 run sorts after a newer h100 run by path.
    #[test]
    fn the_latest_run_is_ordered_by_its_date() {
        let dir = tempfile::tempdir().expect("tempdir");
        let line = |ms: f64| {
            format!("time mma fwd  B2 H16 KV8 T2048 past0 D128: forward {ms} ms, 1 GB/s (K/V once), 1.0 TFLOP/s; backward 1.0 ms, 1.0 TFLOP/s\n")
        };
        for (run, ms) in [
            ("nvidia-h200-20260101", 1.0),
            ("nvidia-h100-20260301", 3.0),
            ("nvidia-h200-20260201", 2.0),
        ] {
            let d = dir.path().join(run).join("logs");
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("flash_kernels_check.log"), line(ms)).expect("write");
        }
        let (log, lines) = timed(dir.path()).expect("a timed run");
        assert!(
            log.to_string_lossy().contains("nvidia-h100-20260301"),
            "{}",
            log.display()
        );
        assert_eq!(lines[0].fwd_ms, 3.0);
        assert_eq!(
            run_date(Path::new(
                "results/gpu/a-20261127/x/flash_kernels_check.log"
            )),
            Some("20261127")
        );
        assert_eq!(run_date(Path::new("flash_kernels_check.log")), None);
    }

    #[test]
    fn timed_lines_are_read() {
        let text = "time mma fwd  B2 H16 KV8 T9220 past0 D128: forward 5.015 ms, 45 GB/s (K/V once), 138.9 TFLOP/s; backward 13.614 ms, 127.9 TFLOP/s; forward + backward 18.628 ms, 130.8 TFLOP/s\n\
                    time mma fwd  B64 H16 KV8 T1 past1024 D128: forward 0.1 ms, 1 GB/s (K/V once), 1.0 TFLOP/s\n\
                    time row fwd  B2 H16 KV8 T2048 past0 D128: forward 13.671 ms, …; backward 28.998 ms, …\n";
        let got = timed_lines(text);
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0],
            Timed {
                batch: 2,
                heads: 16,
                kv: 8,
                t: 9220,
                d: 128,
                fwd_ms: 5.015,
                bwd_ms: 13.614
            }
        );
    }
}
