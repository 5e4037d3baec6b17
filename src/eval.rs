//! Avg@k evaluation (paper Section 5): k samples per problem at the manifest's temperature and
//! top-p, each judged by [`crate::reward::judge`] (the verifier).
//!
//! - Avg@k of a benchmark = mean over problems of the fraction of its k samples that are correct
//!   (the paper's "Pass@1 averaged over k samples").
//! - Weighted accuracy = Σ_b n_b · Avg@k_b / Σ_b n_b with n_b the problems evaluated (500 / 272 /
//!   675 / 230 for the full benchmarks; this reproduces the paper's weighted column).
//! - Unbiased pass@j (Chen et al. 2021): 1 − C(k − c, j)/C(k, j), averaged over problems.
//! - Per-problem pass rates are kept: they define easy / medium / hard for the r·Â histograms.
//! - maj@k ([`maj_at_k`], `acpo eval` only): per problem, a majority vote over its k samples'
//!   extracted answers; the problem counts as correct when the verdict of the winning answer is.
//!   Answers vote together when their extracted strings are equal (the string the verifier
//!   extracted, as verl votes on the reward's `pred` and lighteval on the extracted answer), not
//!   when the verifier finds them equivalent: that relation is not transitive (numeric
//!   tolerances), so classes built from it would depend on the order of the samples. A sample with
//!   no extracted answer does not vote; a problem with none counts as wrong. Ties go to the answer
//!   whose first sample comes first (lowest sample index), which is what verl's `calc_maj_val`
//!   and lighteval's `MajAtK` pick too; the winner's verdict is that of its first sample. Unlike
//!   verl (a bootstrap estimate over subsets of n samples) it is exact, over all k samples. It
//!   also differs from verl where samples have no answer: `acpo.verl`'s reward returns `pred: ""`
//!   for them and verl votes on `""` like any answer, so where they outnumber the largest answer
//!   (or tie with it, the first of them coming first) verl's winner is `""`, scored wrong, while
//!   this vote picks that answer; with every sample answered the two pick the same sample.
//!   The Python package's `acpo.majority_vote` is the same vote, checked on shared cases
//!   (python/tests/fixtures/majority.json).
//!   Training's `eval.jsonl` has no maj@k: it keeps no per-sample answers to vote on.
//!
//! Sampling is seeded per (seed, benchmark, problem, sample), independent of batching.

use crate::files::PathIoError;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::data::DataSuite;
use crate::data::{self, DataLocation, Problem};
use crate::manifest::Experiment;
use crate::model::load::eos_ids;
use crate::model::qwen::Qwen;
use crate::model::tokenizer::{Message, Tokenizer};
use crate::reward::{self, Judged};
use crate::rollout::{self, KvLayout, SampleRequest, SamplingParams};

/// One judged sample.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SampleRecord {
    pub benchmark: String,
    pub problem_id: String,
    pub sample_index: usize,
    pub response: String,
    pub extracted: Option<String>,
    pub correct: bool,
    pub error: Option<String>,
    pub finish_reason: rollout::FinishReason,
    pub num_tokens: usize,
}

/// Per-benchmark result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub benchmark: String,
    pub problems: usize,
    pub k: usize,
    /// Avg@k in [0, 1].
    pub avg_at_k: f64,
    /// Unbiased pass@j for j = 1, 2, 4, … ≤ k.
    pub pass_at: BTreeMap<usize, f64>,
    /// Fraction correct per problem id.
    pub pass_rates: BTreeMap<String, f64>,
    /// maj@k in [0, 1] ([`maj_at_k`]): set by `acpo eval` from its samples, absent from
    /// training's evaluations (and then not written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maj_at_k: Option<f64>,
}

/// The evaluation of one checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    pub step: usize,
    pub benchmarks: Vec<BenchResult>,
    /// Problem-count-weighted mean of the Avg@k values.
    pub weighted_accuracy: f64,
    /// verl-style flat metrics: `val-core/<benchmark>/acc/mean@k`, `val-core/weighted/acc/mean@k`.
    pub metrics: BTreeMap<String, f64>,
}

/// Unbiased pass@j from c correct of n samples.
pub fn pass_at(n: usize, c: usize, j: usize) -> f64 {
    if j > n {
        return f64::NAN;
    }
    if n - c < j {
        return 1.0;
    }
    // 1 − Π_{i = n−c+1}^{n} (1 − j/i), numerically stable
    1.0 - ((n - c + 1)..=n)
        .map(|i| 1.0 - j as f64 / i as f64)
        .product::<f64>()
}

/// Aggregates correctness `correct[p][s]` (problem p, sample s) of one benchmark.
pub fn bench_result(name: &str, ids: &[String], correct: &[Vec<bool>]) -> BenchResult {
    let k = correct.first().map_or(0, Vec::len);
    let mut pass_rates = BTreeMap::new();
    let mut sum = 0.0;
    for (id, row) in ids.iter().zip(correct) {
        let rate = row.iter().filter(|c| **c).count() as f64 / row.len().max(1) as f64;
        pass_rates.insert(id.clone(), rate);
        sum += rate;
    }
    let mut pass = BTreeMap::new();
    let mut j = 1;
    while j <= k {
        let v = correct
            .iter()
            .map(|r| pass_at(r.len(), r.iter().filter(|c| **c).count(), j))
            .sum::<f64>()
            / correct.len().max(1) as f64;
        pass.insert(j, v);
        j *= 2;
    }
    BenchResult {
        benchmark: name.to_string(),
        problems: ids.len(),
        k,
        avg_at_k: sum / ids.len().max(1) as f64,
        pass_at: pass,
        pass_rates,
        maj_at_k: None,
    }
}

/// The sample whose answer wins a majority vote over one problem's samples, given in sample
/// order as (extracted answer, verdict): answers vote together when their strings are equal, a
/// sample with no answer does not vote, a tie goes to the answer seen first. None when no sample
/// has an answer.
pub fn majority_vote<'a>(answers: impl IntoIterator<Item = Option<&'a str>>) -> Option<usize> {
    // answer -> (votes, first sample)
    let mut votes: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (i, a) in answers.into_iter().enumerate() {
        if let Some(a) = a {
            votes.entry(a).or_insert((0, i)).0 += 1;
        }
    }
    votes
        .into_values()
        .max_by(|(n, first), (m, other)| n.cmp(m).then(other.cmp(first)))
        .map(|(_, first)| first)
}

/// maj@k per benchmark from an evaluation's samples (module docs): the fraction of problems
/// whose majority answer is correct. Samples are taken in sample order within each problem,
/// whatever order the records come in.
pub fn maj_at_k(records: &[SampleRecord]) -> BTreeMap<String, f64> {
    let mut problems: BTreeMap<(&str, &str), Vec<&SampleRecord>> = BTreeMap::new();
    for r in records {
        problems
            .entry((&r.benchmark, &r.problem_id))
            .or_default()
            .push(r);
    }
    let mut tally: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for ((bench, _), mut samples) in problems {
        samples.sort_by_key(|r| r.sample_index);
        let winner = majority_vote(samples.iter().map(|r| r.extracted.as_deref()));
        let entry = tally.entry(bench.to_string()).or_default();
        entry.0 += usize::from(winner.is_some_and(|i| samples[i].correct));
        entry.1 += 1;
    }
    tally
        .into_iter()
        .map(|(b, (right, n))| (b, right as f64 / n as f64))
        .collect()
}

/// Weighted accuracy and metric names over per-benchmark results.
pub fn summarize(step: usize, benchmarks: Vec<BenchResult>) -> EvalSummary {
    let total: usize = benchmarks.iter().map(|b| b.problems).sum();
    let weighted = benchmarks
        .iter()
        .map(|b| b.avg_at_k * b.problems as f64)
        .sum::<f64>()
        / total.max(1) as f64;
    let mut metrics = BTreeMap::new();
    let k = benchmarks.first().map_or(0, |b| b.k);
    for b in &benchmarks {
        metrics.insert(
            format!("val-core/{}/acc/mean@{}", b.benchmark, b.k),
            b.avg_at_k,
        );
        for (j, v) in &b.pass_at {
            metrics.insert(format!("val-aux/{}/acc/pass@{j}", b.benchmark), *v);
        }
    }
    metrics.insert(format!("val-core/weighted/acc/mean@{k}"), weighted);
    EvalSummary {
        step,
        benchmarks,
        weighted_accuracy: weighted,
        metrics,
    }
}

/// Sequences per sampler call on the CPU: bounds KV-cache memory. It is part of what a result
/// depends on, at the last bit: a call's prompts are left-padded to its longest, and the padding
/// changes the prefill's floating-point sums, so a completion whose next token is a near tie can
/// differ with the batch. 64, as every shipped result was made (REPRODUCE.md, "Known sources of
/// nondeterminism"; 1024 per call made an xs run a fifth faster, the l and m runs not,
/// docs/PERFORMANCE.md). On a GPU a benchmark's samples go in one call that decodes as many at
/// once as the device's memory holds ([`rollout::device_slots`], issue #34).
const GENERATE_BATCH: usize = 64;

/// Evaluates `model` on the benchmarks of `exp`'s eval section (from its data suite, with its
/// seed), its sampler's KV cache as the manifest's `kv_layout` says. Returns the summary and
/// every sample.
pub fn evaluate(
    model: &Qwen,
    tokenizer: &Tokenizer,
    exp: &Experiment,
    data: &DataLocation,
    step: usize,
    progress: impl FnMut(&str, usize, usize),
) -> Result<(EvalSummary, Vec<SampleRecord>), EvalError> {
    evaluate_with(model, tokenizer, exp, data, step, exp.kv_layout(), progress)
}

/// [`evaluate`] with the sampler's KV cache held as `layout` says.
pub fn evaluate_with(
    model: &Qwen,
    tokenizer: &Tokenizer,
    exp: &Experiment,
    data: &DataLocation,
    step: usize,
    layout: KvLayout,
    mut progress: impl FnMut(&str, usize, usize),
) -> Result<(EvalSummary, Vec<SampleRecord>), EvalError> {
    let (spec, suite, seed) = (&exp.eval, exp.data.suite, exp.seed);
    let params = SamplingParams {
        temperature: spec.sampling.temperature,
        top_p: spec.sampling.top_p,
        top_k: spec.sampling.top_k,
        max_new_tokens: spec.max_new_tokens,
    };
    let eos = eos_ids(model.config(), tokenizer);
    let mut results = Vec::new();
    let mut records = Vec::new();
    for (bi, b) in spec.benchmarks.iter().enumerate() {
        let mut problems: Vec<Problem> = match suite {
            DataSuite::Real => data::load(data::spec(*b), data)?,
            DataSuite::Synthetic => data::synthetic::benchmark(*b),
        };
        if let Some(limit) = spec.limit {
            problems.truncate(limit);
        }
        let prompts = problems
            .iter()
            .map(|p| {
                encode_prompt(
                    tokenizer,
                    spec.prompt_template,
                    spec.apply_chat_template,
                    &p.problem,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let k = spec.sampling.n;
        // (problem, sample) jobs in a fixed order; each has its own random stream.
        let jobs: Vec<(usize, usize)> = (0..problems.len())
            .flat_map(|p| (0..k).map(move |s| (p, s)))
            .collect();
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let request = SampleRequest::new(params)
            .eos(eos.clone())
            .pad(tokenizer.pad_id());
        let request = layout.request(request, model, longest);
        let paged = request.paged.is_some();
        let per_call = match (request.max_batch, paged && model.device().is_cuda()) {
            (Some(_), _) | (None, true) => jobs.len().max(1),
            (None, false) => GENERATE_BATCH,
        };
        let mut correct = vec![vec![false; k]; problems.len()];
        for (done, chunk) in jobs.chunks(per_call).enumerate() {
            let batch: Vec<Vec<u32>> = chunk.iter().map(|(p, _)| prompts[*p].clone()).collect();
            let keys: Vec<[u64; 4]> = chunk
                .iter()
                .map(|(p, s)| [seed, EVAL_STREAM ^ (bi as u64), *p as u64, *s as u64])
                .collect();
            let outs = rollout::generate(model, &batch, &keys, &request)?;
            for ((p, s), out) in chunk.iter().zip(outs) {
                let Judged {
                    response,
                    verdict: v,
                } = reward::judge(tokenizer, &out.tokens, &problems[*p].answer)?;
                correct[*p][*s] = v.correct;
                records.push(SampleRecord {
                    benchmark: b.name().to_string(),
                    problem_id: problems[*p].id.clone(),
                    sample_index: *s,
                    response,
                    extracted: v.extracted,
                    correct: v.correct,
                    error: v.error,
                    finish_reason: out.finish,
                    num_tokens: out.tokens.len(),
                });
            }
            progress(
                b.name(),
                ((done + 1) * per_call).min(jobs.len()),
                jobs.len(),
            );
        }
        let ids: Vec<String> = problems.iter().map(|p| p.id.clone()).collect();
        results.push(bench_result(b.name(), &ids, &correct));
    }
    Ok((summarize(step, results), records))
}

/// `acpo eval`: loads the manifest's model (or `model`), its KV cache as `kv_cache` and `layout` say,
/// evaluates it, and writes every sample (`samples.jsonl`) and the summary (`summary.json`)
/// into `out`.
#[allow(clippy::too_many_arguments)]
pub fn evaluate_into(
    exp: &Experiment,
    model: Option<crate::hub::ModelSource>,
    hub: &crate::hub::HubOptions,
    data: &DataLocation,
    step: usize,
    kv_cache: crate::model::qwen::KvCacheDtype,
    layout: KvLayout,
    out: &std::path::Path,
    progress: impl FnMut(&str, usize, usize),
) -> Result<EvalSummary, EvalError> {
    let source = model.unwrap_or_else(|| exp.model.source.clone());
    let loaded = crate::model::load::load(
        &source,
        hub,
        exp.device,
        crate::model::Precision::inference(exp.model.dtype),
    )?;
    let policy = Qwen::new(&loaded.cfg, &loaded.params, true)?.with_kv_cache(kv_cache)?;
    let (summary, records) = evaluate_with(
        &policy,
        &loaded.tokenizer,
        exp,
        data,
        step,
        layout,
        progress,
    )?;
    let summary = summary.with_majority(&records);
    let write = |name: &str, body: String| crate::atomic::write_in(out, name, body.as_bytes());
    let lines = records
        .iter()
        .map(|r| format!("{}\n", serde_json::to_string(r).expect("invariant: JSON")))
        .collect();
    write("samples.jsonl", lines)?;
    write(
        "summary.json",
        serde_json::to_string_pretty(&summary).expect("invariant: JSON"),
    )?;
    Ok(summary)
}

impl EvalSummary {
    /// Adds maj@k ([`maj_at_k`]) of each benchmark from the evaluation's samples, with verl's
    /// metric names: `val-core/<benchmark>/acc/maj@k/mean` and the problem-weighted
    /// `val-core/weighted/acc/maj@k/mean`.
    pub fn with_majority(mut self, records: &[SampleRecord]) -> EvalSummary {
        let maj = maj_at_k(records);
        let (mut sum, mut total) = (0.0, 0);
        for b in &mut self.benchmarks {
            let v = maj.get(&b.benchmark).copied().unwrap_or(0.0);
            b.maj_at_k = Some(v);
            self.metrics
                .insert(format!("val-core/{}/acc/maj@{}/mean", b.benchmark, b.k), v);
            sum += v * b.problems as f64;
            total += b.problems;
        }
        let k = self.benchmarks.first().map_or(0, |b| b.k);
        self.metrics.insert(
            format!("val-core/weighted/acc/maj@{k}/mean"),
            sum / total.max(1) as f64,
        );
        self
    }

    /// A line per benchmark and the weighted accuracy, for the user.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for b in &self.benchmarks {
            let (name, n, k) = (&b.benchmark, b.problems, b.k);
            s.push_str(&format!(
                "{name:<14} {n:>4} problems  avg@{k} {:6.2} %",
                100.0 * b.avg_at_k
            ));
            if let Some(maj) = b.maj_at_k {
                s.push_str(&format!("  maj@{k} {:6.2} %", 100.0 * maj));
            }
            s.push('\n');
        }
        s.push_str(&format!(
            "weighted accuracy {:.2} %\n",
            100.0 * self.weighted_accuracy
        ));
        s
    }
}

/// Evaluation streams never collide with training rollouts (whose second key is the step).
const EVAL_STREAM: u64 = 0xE7A1_0000_0000_0000;

/// Token ids of a problem under a prompt template, optionally in the chat template.
pub fn encode_prompt(
    tokenizer: &Tokenizer,
    template: crate::data::PromptTemplate,
    chat: bool,
    problem: &str,
) -> crate::model::Result<Vec<u32>> {
    let user = data::render_prompt(template, problem);
    let text = if chat {
        tokenizer.apply_chat_template(&[Message::user(user)], true)?
    } else {
        user
    };
    tokenizer.encode(&text)
}

/// Why an evaluation could not run: the data or the model.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Io(#[from] PathIoError),
}

impl From<candle_core::Error> for EvalError {
    fn from(e: candle_core::Error) -> Self {
        EvalError::Model(e.into())
    }
}

#[cfg(test)]
mod record_size_tests {
    #[test]
    fn the_manifests_memory_bound_counts_a_whole_sample_record() {
        assert!(
            std::mem::size_of::<super::SampleRecord>() as u128
                <= crate::manifest::SAMPLE_RECORD_BYTES
        );
    }
}
