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

use std::borrow::Cow;

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

/// The items of a sequence argument, refusing a str (its characters are not answers).
fn items<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if obj.is_instance_of::<PyString>() || obj.is_none() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a sequence (a list or tuple), not {}",
            type_name(obj)
        )));
    }
    let iter = obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} must be a sequence (a list or tuple), not {}",
            type_name(obj)
        ))
    })?;
    iter.collect()
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

/// The (gold, answer) texts of two sequences of equal length, every item checked.
fn pairs(
    golds: &Bound<'_, PyAny>,
    answers: &Bound<'_, PyAny>,
    gold_name: &str,
    answer_name: &str,
) -> PyResult<Vec<(String, String)>> {
    let (gs, rs) = (items(golds, gold_name)?, items(answers, answer_name)?);
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
    Ok(py.detach(|| {
        pairs
            .par_iter()
            .map(|(g, r)| f64::from(u8::from(acpo_verify::verify(g, r).correct)))
            .collect()
    }))
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
    Ok(py.detach(|| {
        pairs
            .par_iter()
            .map(|(g, r)| {
                let v = acpo_verify::verify(g, r);
                (!v.gold_unparsed).then_some(v.correct)
            })
            .collect()
    }))
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
    m.add_function(wrap_pyfunction!(candidates, m)?)?;
    m.add_function(wrap_pyfunction!(work_budget, m)?)?;
    Ok(())
}
