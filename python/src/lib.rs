//! `acpo._native`: acpo's verifier (crates/acpo-verify) for Python.
//!
//! Every judgement runs with the GIL released, on the calling thread (`verify`, `judge`) or on
//! every core (`score_batch`, rayon's pool), and ends in bounded work (the verifier's work
//! budget counts operations, never time: no signal, no subprocess, no timeout). The verifier's
//! state is per thread, so any number of Python threads may call at once.
//!
//! What crosses from Python is checked before anything is judged (issue #47 item 6): a response
//! must be `str`; a gold answer `str`, `int` or a finite `float` (numbers as parquet columns hold
//! them). Anything else (None, bytes, a list, a bool, NaN) is a TypeError or ValueError naming
//! the argument and, in a batch, the index: never a silent 0 and never a match of its `str()`.
//! A batch holds at most [`MAX_BATCH`] items, counted while its iterable is read, so an endless
//! iterable is an error rather than an allocation that aborts the interpreter.
//!
//! Batches run on a thread pool of this process's own ([`pool`]): a child forked after a batch
//! (multiprocessing's default start method on Linux) inherits the parent's pool without its
//! threads, so the child builds its own. A batch is judged in chunks, and Python's signal
//! handlers run between them (Ctrl-C ends a long batch within one chunk's time).

use std::borrow::Cow;
use std::sync::atomic::{AtomicPtr, Ordering};

use acpo_verify::extract::{self, Source};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};
use rayon::prelude::*;

/// The text of a response, or a TypeError naming `what`.
fn answer_text(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    let Ok(s) = obj.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "{what} must be str (the response text), not {}",
            type_name(obj)
        )));
    };
    text_of(s, what)
}

/// A gold answer as text: a str as it is, an int in decimal, a finite float in the shortest
/// decimal that reads back as it (no exponent: the verifier reads plain decimals exactly).
fn gold_text(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    if let Ok(s) = obj.cast::<PyString>() {
        return text_of(s, what);
    }
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{what} is a bool ({}); a gold answer must be str, int or a finite float",
            obj.str()?
        )));
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(obj.str()?.to_cow()?.into_owned());
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        let x = f.value();
        if !x.is_finite() {
            return Err(PyValueError::new_err(format!(
                "{what} is the float {x}, which no answer can equal; a gold answer must be \
                 str, int or a finite float"
            )));
        }
        return Ok(format!("{x}"));
    }
    if obj.is_none() {
        return Err(PyTypeError::new_err(format!(
            "{what} is None; a gold answer must be str, int or a finite float"
        )));
    }
    Err(PyTypeError::new_err(format!(
        "{what} must be str, int or a finite float (the gold answer), not {}",
        type_name(obj)
    )))
}

fn text_of(s: &Bound<'_, PyString>, what: &str) -> PyResult<String> {
    s.to_cow()
        .map(Cow::into_owned)
        .map_err(|e| PyValueError::new_err(format!("{what} is not valid Unicode text: {e}")))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    if obj.is_none() {
        return "None".into();
    }
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an unknown type".into())
}

/// The most items one batch may hold: far beyond a training step's responses, and small enough
/// that collecting them (a pointer each, before any text is copied) cannot exhaust memory.
const MAX_BATCH: usize = 1 << 24;

/// Items read from an iterable between two runs of Python's signal handlers.
const ITEMS_PER_SIGNAL_CHECK: usize = 1 << 16;

/// A sequence argument's length where it has one (`len()`), refusing a str (its characters are
/// not answers) and anything that cannot be iterated.
fn sequence_len(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<usize>> {
    let refused = || {
        PyTypeError::new_err(format!(
            "{what} must be a sequence (a list or tuple), not {}",
            type_name(obj)
        ))
    };
    if obj.is_instance_of::<PyString>() || obj.is_none() {
        return Err(refused());
    }
    if let Ok(n) = obj.len() {
        if n > MAX_BATCH {
            return Err(PyValueError::new_err(format!(
                "{what} has {n} items, more than one batch's {MAX_BATCH}: split it"
            )));
        }
        return Ok(Some(n));
    }
    // No len() (a generator, an iterator): iterable is enough, the count is kept while reading.
    obj.try_iter().map(|_| None).map_err(|_| refused())
}

/// The items of a sequence argument, read one by one and refused past `at_most` (`too_many`
/// says why), with Python's signal handlers run while a long iterable is read.
fn items<'py>(
    obj: &Bound<'py, PyAny>,
    at_most: usize,
    too_many: impl Fn() -> String,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let mut out = Vec::new();
    for (n, item) in obj.try_iter()?.enumerate() {
        if n == at_most {
            return Err(PyValueError::new_err(too_many()));
        }
        out.push(item?);
        if (n + 1) % ITEMS_PER_SIGNAL_CHECK == 0 {
            obj.py().check_signals()?;
        }
    }
    Ok(out)
}

fn source_name(s: Source) -> &'static str {
    match s {
        Source::Boxed => "boxed",
        Source::AnswerLine => "answer-line",
        Source::FinalAnswer => "final-answer",
        Source::Latex => "latex",
        Source::Number => "number",
        Source::Whole => "whole",
    }
}

/// Whether `answer` (a model's response: the final answer is extracted from it) states `gold`.
#[pyfunction]
#[pyo3(signature = (gold, answer, *, gold_name = "gold", answer_name = "answer"))]
fn verify(
    py: Python<'_>,
    gold: &Bound<'_, PyAny>,
    answer: &Bound<'_, PyAny>,
    gold_name: &str,
    answer_name: &str,
) -> PyResult<bool> {
    let (g, a) = (
        gold_text(gold, gold_name)?,
        answer_text(answer, answer_name)?,
    );
    Ok(py.detach(|| acpo_verify::verify(&g, &a).correct))
}

/// The whole verdict: (correct, the extracted answer, where it was found, why nothing could be
/// compared, whether that is because the gold does not parse, the work units spent);
/// `acpo.judge` names the fields.
#[pyfunction]
#[pyo3(signature = (gold, answer, *, gold_name = "gold", answer_name = "answer"))]
#[allow(clippy::type_complexity)]
fn judge(
    py: Python<'_>,
    gold: &Bound<'_, PyAny>,
    answer: &Bound<'_, PyAny>,
    gold_name: &str,
    answer_name: &str,
) -> PyResult<(
    bool,
    Option<String>,
    Option<&'static str>,
    Option<String>,
    bool,
    u64,
)> {
    let (g, a) = (
        gold_text(gold, gold_name)?,
        answer_text(answer, answer_name)?,
    );
    let (v, spent) = py.detach(|| acpo_verify::verify_metered(&g, &a));
    Ok((
        v.correct,
        v.extracted,
        v.source.map(source_name),
        v.error,
        v.gold_unparsed,
        spent.units,
    ))
}

/// The (gold, answer) texts of two sequences of equal length, every item checked. Neither is
/// read past [`MAX_BATCH`] items, nor past the other's length where that is known first.
fn pairs(
    golds: &Bound<'_, PyAny>,
    answers: &Bound<'_, PyAny>,
    gold_name: &str,
    answer_name: &str,
) -> PyResult<Vec<(String, String)>> {
    let (gl, rl) = (
        sequence_len(golds, gold_name)?,
        sequence_len(answers, answer_name)?,
    );
    if let (Some(g), Some(r)) = (gl, rl) {
        if g != r {
            return Err(PyValueError::new_err(format!(
                "{g} {gold_name} but {r} {answer_name}: one gold answer per answer"
            )));
        }
    }
    let endless = |what: &str| {
        format!(
            "{what} has more than {MAX_BATCH} items, more than one batch may hold (an endless \
             iterable?): split it"
        )
    };
    let gs = match rl {
        Some(r) => {
            items(golds, r, || {
                format!("{gold_name} has more items than the {r} {answer_name}: one gold answer per answer")
            })?
        }
        None => items(golds, MAX_BATCH, || endless(gold_name))?,
    };
    let n = gs.len();
    let rs = items(answers, n, || {
        format!("{answer_name} has more items than the {n} {gold_name}: one gold answer per answer")
    })?;
    if gs.len() != rs.len() {
        return Err(PyValueError::new_err(format!(
            "{} {gold_name} but {} {answer_name}: one gold answer per answer",
            gs.len(),
            rs.len()
        )));
    }
    gs.iter()
        .zip(&rs)
        .enumerate()
        .map(|(i, (g, r))| {
            Ok((
                gold_text(g, &format!("{gold_name}[{i}]"))?,
                answer_text(r, &format!("{answer_name}[{i}]"))?,
            ))
        })
        .collect()
}

/// This process's thread pool for batches (None where no thread could be started: batches are
/// then judged on the calling thread).
struct Pool {
    pid: u32,
    threads: Option<rayon::ThreadPool>,
}

/// The current process's [`Pool`], never freed. A forked child inherits the pointer to its
/// parent's pool, whose threads it does not have (rayon's global pool would wait on them
/// forever), so a pool is only used by the process that built it: the pid is checked on every
/// batch, and `acpo` also clears the pointer in `os.register_at_fork`'s child hook (a pid can be
/// reused by a grandchild). Lock-free, so a fork at any moment leaves nothing held.
static POOL: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());

fn pool() -> &'static Pool {
    let pid = std::process::id();
    loop {
        let current = POOL.load(Ordering::Acquire);
        // SAFETY: POOL only ever holds null or a pointer from `Box::leak`, never freed.
        if let Some(p) = unsafe { current.as_ref() } {
            if p.pid == pid {
                return p;
            }
        }
        // A parent's pool is left as it is (leaked): its threads are not in this process, and
        // dropping it would signal them.
        let fresh: &'static mut Pool = Box::leak(Box::new(Pool {
            pid,
            threads: rayon::ThreadPoolBuilder::new()
                .thread_name(|i| format!("acpo-verify-{i}"))
                .build()
                .ok(),
        }));
        let fresh_ptr: *mut Pool = fresh;
        if POOL
            .compare_exchange(current, fresh_ptr, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return fresh;
        }
        // Another thread installed one first: use it (this one stays unused).
    }
}

/// Forgets the pool (`os.register_at_fork(after_in_child=...)`): the next batch builds one.
#[pyfunction]
fn _after_fork_in_child() {
    POOL.store(std::ptr::null_mut(), Ordering::Release);
}

/// Pairs judged per thread of the pool between two runs of Python's signal handlers: a chunk
/// of the slowest answers (tens of milliseconds each) still ends within about a second.
const PAIRS_PER_THREAD_PER_CHUNK: usize = 32;

/// `judge(gold, answer)` of every pair, on the pool with the GIL released, in chunks with
/// Python's signal handlers run between them (a KeyboardInterrupt ends the batch).
fn judge_pairs<T: Send>(
    py: Python<'_>,
    pairs: &[(String, String)],
    judge: impl Fn(&str, &str) -> T + Sync,
) -> PyResult<Vec<T>> {
    let pool = pool();
    let threads = pool
        .threads
        .as_ref()
        .map_or(1, rayon::ThreadPool::current_num_threads);
    let chunk = PAIRS_PER_THREAD_PER_CHUNK * threads.max(1);
    let mut out = Vec::with_capacity(pairs.len());
    for part in pairs.chunks(chunk) {
        let judged: Vec<T> = py.detach(|| match &pool.threads {
            Some(p) => p.install(|| part.par_iter().map(|(g, r)| judge(g, r)).collect()),
            None => part.iter().map(|(g, r)| judge(g, r)).collect(),
        });
        out.extend(judged);
        py.check_signals()?;
    }
    Ok(out)
}

/// 1.0 where `answers[i]` states `golds[i]`, else 0.0, judged on every core.
#[pyfunction]
#[pyo3(signature = (golds, answers, *, gold_name = "golds", answer_name = "answers"))]
fn score_batch(
    py: Python<'_>,
    golds: &Bound<'_, PyAny>,
    answers: &Bound<'_, PyAny>,
    gold_name: &str,
    answer_name: &str,
) -> PyResult<Vec<f64>> {
    let pairs = pairs(golds, answers, gold_name, answer_name)?;
    judge_pairs(py, &pairs, |g, r| {
        f64::from(u8::from(acpo_verify::verify(g, r).correct))
    })
}

/// [`score_batch`] as verdicts, None where the gold does not parse (nothing to judge against).
#[pyfunction]
#[pyo3(signature = (golds, answers, *, gold_name = "golds", answer_name = "answers"))]
fn judge_batch(
    py: Python<'_>,
    golds: &Bound<'_, PyAny>,
    answers: &Bound<'_, PyAny>,
    gold_name: &str,
    answer_name: &str,
) -> PyResult<Vec<Option<bool>>> {
    let pairs = pairs(golds, answers, gold_name, answer_name)?;
    judge_pairs(py, &pairs, |g, r| {
        let v = acpo_verify::verify(g, r);
        (!v.gold_unparsed).then_some(v.correct)
    })
}

/// [`judge`] of every pair (the whole verdicts: what was extracted, where, why not), judged on
/// every core.
#[pyfunction]
#[pyo3(signature = (golds, answers, *, gold_name = "golds", answer_name = "answers"))]
#[allow(clippy::type_complexity)]
fn judge_all(
    py: Python<'_>,
    golds: &Bound<'_, PyAny>,
    answers: &Bound<'_, PyAny>,
    gold_name: &str,
    answer_name: &str,
) -> PyResult<
    Vec<(
        bool,
        Option<String>,
        Option<&'static str>,
        Option<String>,
        bool,
        u64,
    )>,
> {
    let pairs = pairs(golds, answers, gold_name, answer_name)?;
    judge_pairs(py, &pairs, |g, r| {
        let (v, spent) = acpo_verify::verify_metered(g, r);
        (
            v.correct,
            v.extracted,
            v.source.map(source_name),
            v.error,
            v.gold_unparsed,
            spent.units,
        )
    })
}

/// The answers the verifier finds in `text`, most preferred first (a response's boxed answer,
/// `Answer:` line, ...; for a gold, also the whole text): what `math_verify_compat.parse` holds.
#[pyfunction]
#[pyo3(signature = (text, *, gold = false))]
fn candidates(py: Python<'_>, text: &Bound<'_, PyAny>, gold: bool) -> PyResult<Vec<String>> {
    let t = if gold {
        gold_text(text, "text")?
    } else {
        answer_text(text, "text")?
    };
    Ok(py.detach(|| {
        let found = if gold {
            extract::gold_candidates(&t)
        } else {
            extract::candidates(&t)
        };
        found.into_iter().map(|c| c.text).collect()
    }))
}

/// The work budget of one judgement, in the verifier's units (about one machine-word
/// operation each).
#[pyfunction]
fn work_budget() -> u64 {
    acpo_verify::work::BUDGET
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(judge, m)?)?;
    m.add_function(wrap_pyfunction!(score_batch, m)?)?;
    m.add_function(wrap_pyfunction!(judge_batch, m)?)?;
    m.add_function(wrap_pyfunction!(judge_all, m)?)?;
    m.add_function(wrap_pyfunction!(candidates, m)?)?;
    m.add_function(wrap_pyfunction!(work_budget, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_in_child, m)?)?;
    m.add("MAX_BATCH", MAX_BATCH)?;
    Ok(())
}
