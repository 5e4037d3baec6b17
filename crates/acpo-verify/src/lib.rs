//! The one judge of answers (docs/ARCHITECTURE.md): the training reward and the evaluator both call
//! [`verify`]. It follows Math-Verify (the paper's verifier) in what it accepts:
//!
//! - the answer is extracted from the response ([`extract`]), the gold's format decides how the
//!   two are compared ("gold decides");
//! - numbers are values, computed exactly as rationals where they are rational (any size: DAPO
//!   answers exceed 2^64; `025` = `25`), and agree within one tolerance (below);
//! - expressions with symbols are compared as functions, at deterministic random points, equal
//!   within f64's round-off (10⁻⁹ relative) at each: no answer tolerance applies to a function
//!   (`x^6 \cdot 10^7 + 1` is not `x^6 \cdot 10^7`);
//! - lists and sets are unordered, tuples and intervals ordered with their bracket types,
//!   `±` expands to both signs, equations compare by their right-hand side when the left is a
//!   name (`k = 1` ~ `1`) and by proportionality otherwise, inequalities by direction; a gold
//!   inequality on a name also accepts the interval it describes (`x > 2` ~ `(2, \infty)`);
//! - a gold of assignments accepts the tuple of its values (`p = 1, q = 2` ~ `(1, 2)`, unordered
//!   as Math-Verify reads such a gold), and a gold matrix a sum, scalar multiple or product of
//!   two written-out matrices that evaluates to it;
//! - a gold tuple accepts several answers in the order given (`(3, 5)` ~ `\boxed{3}, \boxed{5}`
//!   or `\boxed{3, 5}`, not `\boxed{5}, \boxed{3}`); text compares by its words, lowercase,
//!   with "and" / "or" read as the comma they stand for (`\text{Alice and Bob}` ~
//!   `\text{Alice, Bob}`, in order), and a short text joining items (`C or A`) is the list of
//!   them (~ `A \text{ or } C`).
//!
//! # Numeric tolerance
//!
//! An answer of value p matches a gold of value g when |p − g| ≤ τ(g), with
//!
//! - τ(g) = 10⁻⁶ when g is an integer (counts, AIME and DAPO answers: no neighbouring integer
//!   ever matches, however large g is);
//! - τ(g) = 10⁻⁶ · max(|g|, 1) otherwise (a fraction, a decimal, an irrational value: six
//!   decimal places, or six significant digits above 1), except for a small gold, |g| < 10⁻³,
//!   where τ(g) = 10⁻³ · |g|: the answer must carry the gold's first three significant digits,
//!   since six decimal places would accept almost anything of that size (`\frac{1}{2^{98}}` for
//!   `\frac{1}{2^{99}}`, `1.3 \cdot 10^{-7}` for `1.2 \cdot 10^{-7}`; the two rules meet at
//!   |g| = 10⁻³, where both give 10⁻⁶). A gold known only in f64 (an irrational expression)
//!   keeps at least 10⁻¹², f64's round-off near 0.
//!
//! The tolerance depends on the gold alone, never on how the answer is written, so the rule is
//! monotone in the error: a smaller error is never rejected where a larger one is accepted
//! (issue #47: `0.000001` against 0 was accepted and `10^{-9}` rejected; `2^{-1000}` rejected and
//! `2^{-100000000}`, whose f64 value is 0, accepted). All four are accepted now. The error is
//! computed exactly when both values are rational, else in f64 (round-off near 10⁻¹⁶ relative,
//! far below τ); a value that overflows f64 is undecidable and matches nothing.
//!
//! Math-Verify's rule (0.9.0, `sympy_numeric_eq`) is not monotone, which is why it is not ours:
//! where either side is a float it rounds both to 6 decimal places (against 1/3, `0.3333328` is
//! accepted and the closer `0.3333335` rejected) and otherwise requires exact equality
//! (`0.333333` is accepted for 1/3, `\frac{333333}{1000000}` is not). Two values that round alike
//! differ by less than 10⁻⁶, so for a gold of at least 10⁻³ every float answer its rounding
//! accepts, ours accepts (below 10⁻³ ours asks for three significant digits instead); being
//! monotone, ours also accepts every answer closer than that: `355/113` (off by 2.7·10⁻⁷) matches
//! π as `3.141593` (off by 3.5·10⁻⁷) does; Math-Verify takes the second only. The rounding rule of
//! earlier versions of this crate (a prediction with k < 6 decimals matched a gold rounded to k
//! places: `0.33` for 1/3, `0.62` for 0.618, while the closer `0.6181` did not; Math-Verify 0.9.0
//! rejects all three) is gone with it.
//!
//! # Bounds
//!
//! Every input terminates in bounded time and memory: extraction is linear, the parser has a
//! length and depth limit, exact values a bit limit, and the whole judgement a work budget
//! ([`work`]). A failure to parse, or a judgement the budget cut short, is reported as an error
//! in the [`Verdict`], never silently as "wrong".

pub mod exact;
pub mod expr;
pub mod extract;
pub mod work;

use std::borrow::Cow;

use expr::{parse, Expr, RelOp};
use num_traits::ToPrimitive;

/// The outcome of checking one response against one gold answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Verdict {
    pub correct: bool,
    /// The answer text extracted from the response, if any.
    pub extracted: Option<String>,
    pub source: Option<extract::Source>,
    /// Why no comparison was possible (unparseable gold or answer), if that happened.
    pub error: Option<String>,
    /// Whether that was because the gold answer does not parse: the example cannot be judged
    /// at all (TRL's reward functions skip it), whatever the response says.
    #[serde(skip)]
    pub gold_unparsed: bool,
}

/// The numeric tolerance: Math-Verify's six decimal places (module docs, "Numeric tolerance").
pub const TOL: f64 = 1e-6;
/// f64 round-off allowed where expressions with symbols are compared as functions, point by point.
const EVAL_TOL: f64 = 1e-9;
/// Random evaluation points for symbolic comparisons.
const POINTS: usize = 6;

/// Judges `response` against `gold`.
pub fn verify(gold: &str, response: &str) -> Verdict {
    verify_metered(gold, response).0
}

/// [`verify`], with the work the judgement spent. A judgement that ran out of budget without
/// finding the answer equal is an error verdict: "wrong" would be a guess.
pub fn verify_metered(gold: &str, response: &str) -> (Verdict, work::Spent) {
    let (mut verdict, spent) = work::metered(|| judge(gold, response));
    if spent.exhausted && !verdict.correct {
        verdict.error = Some(format!(
            "judging this answer needs more than the verifier's work budget of {} units \
             (verify::work)",
            work::BUDGET
        ));
    }
    (verdict, spent)
}

/// Unicode spaces (no-break, thin, narrow no-break, ideographic: every space separator but
/// U+0020) as ASCII spaces, and invisible format characters (zero-width space, joiners, word
/// joiner, byte-order mark, soft hyphen) removed: `1\u{a0}000` is the number `1 000`, and
/// `1\u{200b}2` the number 12, never a token the parser skips or stops at. ASCII text is
/// returned as it is.
pub fn normalize_unicode(text: &str) -> Cow<'_, str> {
    if text.is_ascii() {
        return Cow::Borrowed(text);
    }
    let space = |c: char| {
        matches!(
            c,
            '\u{a0}' | '\u{1680}' | '\u{2000}'..='\u{200a}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
        )
    };
    let invisible = |c: char| {
        matches!(
            c,
            '\u{ad}' | '\u{180e}' | '\u{200b}'..='\u{200d}' | '\u{2060}' | '\u{feff}'
        )
    };
    if !text.chars().any(|c| space(c) || invisible(c)) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .filter(|c| !invisible(*c))
            .map(|c| if space(c) { ' ' } else { c })
            .collect(),
    )
}

fn judge(gold: &str, response: &str) -> Verdict {
    let (gold, response) = (normalize_unicode(gold), normalize_unicode(response));
    let (gold, response) = (gold.as_ref(), response.as_ref());
    let golds: Vec<Expr> = extract::gold_candidates(gold)
        .into_iter()
        .filter_map(|c| parse(&c.text).ok())
        .collect();
    let preds = extract::candidates(response);
    let first = preds.first().map(|c| (c.text.clone(), c.source));
    // The same text as the gold is correct even when neither parses.
    let gold_texts: Vec<String> = extract::gold_candidates(gold)
        .iter()
        .map(|c| expr::normalize(&c.text))
        .collect();
    if let Some(c) = preds
        .first()
        .filter(|c| gold_texts.contains(&expr::normalize(&c.text)))
    {
        return Verdict {
            correct: true,
            extracted: Some(c.text.clone()),
            source: Some(c.source),
            error: None,
            gold_unparsed: false,
        };
    }
    if golds.is_empty() {
        return Verdict {
            correct: false,
            extracted: first.as_ref().map(|f| f.0.clone()),
            source: first.map(|f| f.1),
            error: Some(format!(
                "the gold answer `{}` could not be parsed",
                truncate(gold)
            )),
            gold_unparsed: true,
        };
    }
    let mut last_error = None;
    for cand in &preds {
        if gold_texts.contains(&expr::normalize(&cand.text)) {
            return Verdict {
                correct: true,
                extracted: Some(cand.text.clone()),
                source: Some(cand.source),
                error: None,
                gold_unparsed: false,
            };
        }
        match parse(&cand.text) {
            Ok(p) => {
                let correct = golds.iter().any(|g| equal_top(g, &p));
                return Verdict {
                    correct,
                    extracted: Some(cand.text.clone()),
                    source: Some(cand.source),
                    error: None,
                    gold_unparsed: false,
                };
            }
            Err(e) => last_error = Some(format!("answer `{}`: {e}", truncate(&cand.text))),
        }
    }
    Verdict {
        correct: false,
        extracted: first.as_ref().map(|f| f.0.clone()),
        source: first.map(|f| f.1),
        error: last_error
            .or_else(|| Some("no answer found in the response".into()))
            .filter(|_| !preds.is_empty()),
        gold_unparsed: false,
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// Whether `e` names something rather than states a value: it has symbols and no numbers
/// (`x`, `f(x)`, `|AB|`, `(p, q)`, `A:B`, `NO/BO`).
fn is_name(e: &Expr) -> bool {
    fn walk(e: &Expr, syms: &mut bool) -> bool {
        match e {
            Expr::Sym(_) => {
                *syms = true;
                true
            }
            Expr::Num { .. } | Expr::Pi | Expr::E | Expr::Inf | Expr::Text(_) => false,
            Expr::Add(v) | Expr::Mul(v) | Expr::Func(_, v) | Expr::Set(v) | Expr::List(v) => {
                v.iter().all(|x| walk(x, syms))
            }
            Expr::Seq { items, .. } => items.iter().all(|x| walk(x, syms)),
            Expr::Neg(a) => walk(a, syms),
            Expr::Div(a, b) | Expr::Pow(a, b) => walk(a, syms) && walk(b, syms),
            _ => false,
        }
    }
    let mut syms = false;
    walk(e, &mut syms) && syms
}

/// The value an answer states: the right-hand side of `name = value`, the last value of a chain
/// `x = … = value` (of `a = b` too for a prediction, `pred = true`), the value of `x ∈ S`, and the
/// value before `≈` when there is an `=` (else after it).
fn stated_value_of(e: &Expr, pred: bool) -> Option<&Expr> {
    let Expr::Rel(items, ops) = e else {
        return None;
    };
    if !ops
        .iter()
        .all(|o| matches!(o, RelOp::Eq | RelOp::Approx | RelOp::In))
    {
        return None;
    }
    let eqs = ops.iter().filter(|o| **o != RelOp::Approx).count();
    if !(is_name(&items[0]) || pred || eqs >= 2) {
        return None;
    }
    let k = ops
        .iter()
        .rposition(|o| *o != RelOp::Approx)
        .unwrap_or(ops.len() - 1);
    Some(&items[k + 1])
}

fn stated_value(e: &Expr) -> Option<&Expr> {
    stated_value_of(e, false)
}

/// Items of a list with their stated values (`a = 4, -8` → `4, -8`) if any item states one.
fn list_values(e: &Expr, pred: bool) -> Option<Expr> {
    let Expr::List(items) = e else { return None };
    if !items.iter().any(|x| stated_value_of(x, pred).is_some()) {
        return None;
    }
    Some(Expr::List(
        items
            .iter()
            .map(|x| stated_value_of(x, pred).unwrap_or(x).clone())
            .collect(),
    ))
}

fn equal_top(g: &Expr, p: &Expr) -> bool {
    if equal(g, p, 0) {
        return true;
    }
    // gold `k = 1` vs `1`, or `1` vs `x = 1`, or lists of such
    let gv = stated_value(g).cloned().or_else(|| list_values(g, false));
    let pv = stated_value_of(p, true)
        .cloned()
        .or_else(|| list_values(p, true));
    match (gv, pv) {
        (Some(a), Some(b)) => equal(&a, &b, 0) || equal(&a, p, 0) || equal(g, &b, 0),
        (Some(a), None) => equal(&a, p, 0) || values_as_tuple(&a, p),
        (None, Some(b)) => equal(g, &b, 0),
        (None, None) => false,
    }
}

/// A tuple answer against a gold of several assignments (`p = 1, q = 2` ~ `(1, 2)`): the
/// values compared unordered, as Math-Verify 0.9.0 reads such a gold (the set of its values:
/// it accepts `(2, 1)` too).
fn values_as_tuple(values: &Expr, p: &Expr) -> bool {
    let (
        Expr::List(vs),
        Expr::Seq {
            open: '(',
            close: ')',
            items,
        },
    ) = (values, unwrap_single(p))
    else {
        return false;
    };
    vs.len() >= 2 && vs.len() == items.len() && multiset_equal(vs, items, 0)
}

fn unwrap_single(e: &Expr) -> &Expr {
    match e {
        Expr::List(v) | Expr::Set(v) if v.len() == 1 => unwrap_single(&v[0]),
        Expr::Seq {
            open: '(',
            close: ')',
            items,
        } if items.len() == 1 => unwrap_single(&items[0]),
        Expr::Seq { items, .. } if items.len() == 1 && matches!(items[0], Expr::Matrix(_)) => {
            &items[0]
        }
        other => other,
    }
}

/// ± expanded: `a ± b` → [a + b, a − b] (nested ± multiply out, at most [`PM_VARIANTS`]).
fn expand_pm(e: &Expr) -> Vec<Expr> {
    if !work::charge(1) {
        return vec![e.clone()];
    }
    match e {
        Expr::Pm(a, b) => {
            // each side expanded once: recomputing `b` per variant of `a` was ~9^depth calls
            let (xs, ys) = (expand_pm(a), expand_pm(b));
            let mut out = Vec::new();
            'all: for x in &xs {
                for y in &ys {
                    if out.len() >= PM_VARIANTS {
                        break 'all;
                    }
                    out.push(Expr::Add(vec![x.clone(), y.clone()]));
                    out.push(Expr::Add(vec![x.clone(), Expr::Neg(Box::new(y.clone()))]));
                }
            }
            out.truncate(PM_VARIANTS);
            out
        }
        Expr::Div(a, b) if contains_pm(a) => expand_pm(a)
            .into_iter()
            .map(|x| Expr::Div(Box::new(x), b.clone()))
            .collect(),
        other => vec![other.clone()],
    }
}

/// Variants a ± answer expands to.
const PM_VARIANTS: usize = 8;

fn contains_pm(e: &Expr) -> bool {
    match e {
        Expr::Pm(..) => true,
        Expr::Div(a, _) => contains_pm(a),
        _ => false,
    }
}

/// The members of a collection answer (lists, sets, ± expansions), or None for a single value.
fn members(e: &Expr) -> Option<Vec<Expr>> {
    match e {
        Expr::List(v) | Expr::Set(v) => Some(v.iter().flat_map(expand_pm).collect()),
        _ if contains_pm(e) => Some(expand_pm(e)),
        _ => None,
    }
}

fn equal(g: &Expr, p: &Expr, depth: usize) -> bool {
    if depth > 16 || !work::charge(work::STEP) {
        return false;
    }
    let (g, p) = (unwrap_single(g), unwrap_single(p));
    if g == p {
        return true;
    }
    // Collections compare as multisets.
    if let (Some(gs), Some(ps)) = (members(g), members(p)) {
        return multiset_equal(&gs, &ps, depth);
    }
    match (g, p) {
        (Expr::Text(a), Expr::Text(b)) => norm_text(a) == norm_text(b),
        // A short text answer joined by "and" / "or" against the same items as a list
        // (`A \text{ or } C` ~ `C or A`), unordered as lists are.
        (Expr::Text(t), Expr::List(items)) | (Expr::List(items), Expr::Text(t)) => {
            text_items(t).is_some_and(|parts| multiset_equal(&parts, items, depth))
        }
        (Expr::Text(a), Expr::Sym(b)) | (Expr::Sym(b), Expr::Text(a)) => {
            norm_text(a) == norm_text(b)
        }
        (
            Expr::Seq {
                open: o1,
                close: c1,
                items: a,
            },
            Expr::Seq {
                open: o2,
                close: c2,
                items: b,
            },
        ) => {
            o1 == o2
                && c1 == c2
                && a.len() == b.len()
                && a.iter().zip(b).all(|(x, y)| equal(x, y, depth + 1))
        }
        // A tuple against a set: in the set's order (Math-Verify sorts the set).
        (
            Expr::Seq {
                open: '(',
                close: ')',
                items,
            },
            Expr::Set(s),
        )
        | (
            Expr::Set(s),
            Expr::Seq {
                open: '(',
                close: ')',
                items,
            },
        ) => {
            let mut sorted = s.clone();
            sorted.sort_by(|x, y| x.eval(&|_| f64::NAN).total_cmp(&y.eval(&|_| f64::NAN)));
            items.len() == sorted.len()
                && items
                    .iter()
                    .zip(&sorted)
                    .all(|(x, y)| equal(x, y, depth + 1))
        }
        // A gold tuple against several answers in order (`(3, 5)` ~ `\boxed{3}, \boxed{5}` or
        // `\boxed{3, 5}`): the parts of a multi-part answer, read in the order given, as
        // Math-Verify 0.9.0 judges them (it refuses `\boxed{5}, \boxed{3}`, and a closed `[3, 5]`).
        (
            Expr::Seq {
                open: '(',
                close: ')',
                items,
            },
            Expr::List(parts),
        ) => {
            items.len() == parts.len()
                && items.iter().zip(parts).all(|(x, y)| equal(x, y, depth + 1))
        }
        (Expr::Union(a), Expr::Union(b)) => multiset_equal(a, b, depth),
        (Expr::Matrix(a), Expr::Matrix(b)) => {
            a.len() == b.len()
                && a.iter().zip(b).all(|(r, s)| {
                    r.len() == s.len() && r.iter().zip(s).all(|(x, y)| equal(x, y, depth + 1))
                })
        }
        // A matrix answer written as an expression of matrices (a sum, a scalar multiple, a
        // product), as Math-Verify evaluates it.
        (Expr::Matrix(a), Expr::Add(_) | Expr::Mul(_) | Expr::Neg(_)) => matrix_value(p, true)
            .is_some_and(|m| {
                a.len() == m.len()
                    && a.iter().zip(&m).all(|(r, s)| {
                        r.len() == s.len() && r.iter().zip(s).all(|(x, y)| equal(x, y, depth + 1))
                    })
            }),
        (Expr::Rel(..), Expr::Rel(..)) => relation_equal(g, p, depth),
        // A gold inequality chain accepts its interval; a gold interval does not accept a chain
        // (Math-Verify's default, allow_set_relation_comp = false).
        (Expr::Rel(..), Expr::Seq { .. }) => interval_of(g)
            .or_else(|| ray_of(g))
            .is_some_and(|i| equal(&i, p, depth + 1)),
        (Expr::Percent(a), _) => value_equal(g, p) || equal(a, p, depth + 1),
        (_, Expr::Percent(b)) => value_equal(g, p) || equal(g, b, depth + 1),
        _ => is_value(g) && is_value(p) && value_equal(g, p),
    }
}

/// Largest matrix side, and most terms of a sum, [`matrix_value`] works with.
const MATRIX_SIDE: usize = 8;
/// Most matrices in one product (the entries' size grows with each).
const MATRIX_FACTORS: usize = 2;

/// The entries of an expression of matrices: a sum or difference of matrices of one shape, or
/// of scalar multiples and products (of at most [`MATRIX_FACTORS`] matrices of matching
/// shapes) of written-out matrices; None for anything else. Bounded: at most
/// [`MATRIX_SIDE`] rows, columns and terms, no sum inside a product or a sum.
fn matrix_value(e: &Expr, allow_sum: bool) -> Option<Vec<Vec<Expr>>> {
    if !work::charge(work::STEP) {
        return None;
    }
    match unwrap_single(e) {
        Expr::Matrix(rows) => (!rows.is_empty()
            && rows.len() <= MATRIX_SIDE
            && rows[0].len() <= MATRIX_SIDE
            && rows
                .iter()
                .all(|r| r.len() == rows[0].len() && !r.is_empty()))
        .then(|| rows.clone()),
        Expr::Neg(a) => Some(
            matrix_value(a, allow_sum)?
                .into_iter()
                .map(|r| r.into_iter().map(|x| Expr::Neg(Box::new(x))).collect())
                .collect(),
        ),
        Expr::Add(terms) if allow_sum && terms.len() <= MATRIX_SIDE => {
            let ms = terms
                .iter()
                .map(|t| matrix_value(t, false))
                .collect::<Option<Vec<_>>>()?;
            let (rows, cols) = (ms[0].len(), ms[0][0].len());
            if ms.iter().any(|m| m.len() != rows || m[0].len() != cols) {
                return None;
            }
            Some(
                (0..rows)
                    .map(|i| {
                        (0..cols)
                            .map(|j| Expr::Add(ms.iter().map(|m| m[i][j].clone()).collect()))
                            .collect()
                    })
                    .collect(),
            )
        }
        Expr::Mul(factors) => {
            let mut scalars = Vec::new();
            let mut matrices = Vec::new();
            for f in factors {
                match unwrap_single(f) {
                    Expr::Matrix(_) => matrices.push(matrix_value(f, false)?),
                    other if is_value(other) && !has_matrix(other) => scalars.push(f.clone()),
                    _ => return None,
                }
            }
            if matrices.is_empty() || matrices.len() > MATRIX_FACTORS {
                return None;
            }
            let mut product = matrices.remove(0);
            for m in matrices {
                if product[0].len() != m.len() {
                    return None;
                }
                product = (0..product.len())
                    .map(|i| {
                        (0..m[0].len())
                            .map(|j| {
                                Expr::Add(
                                    (0..m.len())
                                        .map(|k| {
                                            Expr::Mul(vec![product[i][k].clone(), m[k][j].clone()])
                                        })
                                        .collect(),
                                )
                            })
                            .collect()
                    })
                    .collect();
            }
            if scalars.is_empty() {
                return Some(product);
            }
            Some(
                product
                    .into_iter()
                    .map(|r| {
                        r.into_iter()
                            .map(|x| {
                                let mut v = scalars.clone();
                                v.push(x);
                                Expr::Mul(v)
                            })
                            .collect()
                    })
                    .collect(),
            )
        }
        _ => None,
    }
}

/// Whether a matrix appears anywhere in `e` (such a factor is no scalar).
fn has_matrix(e: &Expr) -> bool {
    match e {
        Expr::Matrix(_) => true,
        Expr::Add(v) | Expr::Mul(v) | Expr::Func(_, v) | Expr::Set(v) | Expr::List(v) => {
            v.iter().any(has_matrix)
        }
        Expr::Seq { items, .. } => items.iter().any(has_matrix),
        Expr::Neg(a) | Expr::Percent(a) => has_matrix(a),
        Expr::Div(a, b) | Expr::Pow(a, b) | Expr::Pm(a, b) => has_matrix(a) || has_matrix(b),
        _ => false,
    }
}

fn is_value(e: &Expr) -> bool {
    !matches!(
        e,
        Expr::Text(_)
            | Expr::Seq { .. }
            | Expr::Set(_)
            | Expr::List(_)
            | Expr::Union(_)
            | Expr::Matrix(_)
            | Expr::Rel(..)
            | Expr::Pm(..)
    )
}

/// Set equality (Math-Verify compares finite sets, so repeated members count once).
fn multiset_equal(a: &[Expr], b: &[Expr], depth: usize) -> bool {
    if a.len() > 64 || b.len() > 64 {
        return false;
    }
    let dedup = |v: &[Expr]| {
        let mut out: Vec<Expr> = Vec::new();
        for x in v {
            if !out.iter().any(|y| equal(x, y, depth + 1)) {
                out.push(x.clone());
            }
        }
        out
    };
    let (a, b) = (dedup(a), dedup(b));
    if a.len() != b.len() {
        return false;
    }
    let mut used = vec![false; b.len()];
    'outer: for x in &a {
        for (j, y) in b.iter().enumerate() {
            if !used[j] && equal(x, y, depth + 1) {
                used[j] = true;
                continue 'outer;
            }
        }
        return false;
    }
    true
}

/// "and" / "or" (any case): a word that joins the items of a short text answer.
fn is_connective(word: &str) -> bool {
    word.eq_ignore_ascii_case("and") || word.eq_ignore_ascii_case("or")
}

/// A text answer as it is compared: lowercase, its items (separated by commas or the
/// connectives "and" / "or") in order, each the letters and digits of its words without spaces
/// (`\text{Alice and Bob}` ~ `\text{Alice, Bob}`, `\text{red or blue}` ~ `\text{red, blue}`,
/// `\text{north east}` ~ `\text{northeast}`, as Math-Verify 0.9.0 compares such strings), so
/// items never run together: `\text{I and II}` is not `III`.
fn norm_text(s: &str) -> String {
    let lower = s.to_lowercase();
    let mut items: Vec<String> = vec![String::new()];
    let mut word = String::new();
    let end_word = |word: &mut String, items: &mut Vec<String>| {
        if is_connective(word) {
            items.push(String::new());
        } else {
            items
                .last_mut()
                .expect("invariant: one item")
                .push_str(word);
        }
        word.clear();
    };
    for c in lower.chars() {
        if c.is_alphanumeric() {
            word.push(c);
            continue;
        }
        end_word(&mut word, &mut items);
        if c == ',' || c == ';' {
            items.push(String::new());
        }
    }
    end_word(&mut word, &mut items);
    items.retain(|i| !i.is_empty());
    if items.is_empty() {
        // a connective alone ("and") is a word, not a separator
        return lower.chars().filter(|c| c.is_alphanumeric()).collect();
    }
    items.join(",")
}

/// The items of a short text answer joined by commas, "and" or "or" (`C or A`: `C`, `A`), each
/// parsed; None for text that joins fewer than two items.
fn text_items(s: &str) -> Option<Vec<Expr>> {
    let mut parts: Vec<Vec<&str>> = vec![Vec::new()];
    for piece in s.split_inclusive([' ', ',']) {
        let word = piece.trim_matches([' ', ',']);
        if is_connective(word) {
            parts.push(Vec::new());
        } else if !word.is_empty() {
            parts.last_mut().expect("invariant: one part").push(word);
        }
        if piece.ends_with(',') {
            parts.push(Vec::new());
        }
    }
    parts.retain(|p| !p.is_empty());
    if parts.len() < 2 || parts.len() > 16 {
        return None;
    }
    parts.iter().map(|p| parse(&p.join(" ")).ok()).collect()
}

/// `a < x < b` (or ≤) as the interval it describes.
fn interval_of(e: &Expr) -> Option<Expr> {
    let Expr::Rel(items, ops) = e else {
        return None;
    };
    if items.len() != 3 || !is_name(&items[1]) {
        return None;
    }
    let lower = |o: RelOp| matches!(o, RelOp::Lt | RelOp::Le);
    if !(lower(ops[0]) && lower(ops[1])) {
        return None;
    }
    Some(Expr::Seq {
        open: if ops[0] == RelOp::Le { '[' } else { '(' },
        close: if ops[1] == RelOp::Le { ']' } else { ')' },
        items: vec![items[0].clone(), items[2].clone()],
    })
}

/// A single inequality on a name as the interval it describes: `x > a` (or `a < x`) as
/// `(a, ∞)`, `x ≤ b` as `(-∞, b]`. Only a gold uses it, against an interval answer (a gold
/// inequality accepts its interval, as Math-Verify's does; not the other way round).
fn ray_of(e: &Expr) -> Option<Expr> {
    let Expr::Rel(items, ops) = e else {
        return None;
    };
    if ops.len() != 1 {
        return None;
    }
    // Written with the name on the left: `x op bound`.
    let (op, bound) = if is_name(&items[0]) && !is_name(&items[1]) {
        (ops[0], &items[1])
    } else if is_name(&items[1]) && !is_name(&items[0]) {
        let flipped = match ops[0] {
            RelOp::Lt => RelOp::Gt,
            RelOp::Le => RelOp::Ge,
            RelOp::Gt => RelOp::Lt,
            RelOp::Ge => RelOp::Le,
            _ => return None,
        };
        (flipped, &items[0])
    } else {
        return None;
    };
    let minus_inf = Expr::Neg(Box::new(Expr::Inf));
    let (open, close, items) = match op {
        RelOp::Gt => ('(', ')', vec![bound.clone(), Expr::Inf]),
        RelOp::Ge => ('[', ')', vec![bound.clone(), Expr::Inf]),
        RelOp::Lt => ('(', ')', vec![minus_inf, bound.clone()]),
        RelOp::Le => ('(', ']', vec![minus_inf, bound.clone()]),
        _ => return None,
    };
    Some(Expr::Seq { open, close, items })
}

/// Relations: `name = v` by value, equations by proportional sides, inequalities by direction.
fn relation_equal(g: &Expr, p: &Expr, depth: usize) -> bool {
    if let (Some(a), Some(b)) = (interval_of(g), interval_of(p)) {
        return equal(&a, &b, depth + 1);
    }
    let (Expr::Rel(gi, go), Expr::Rel(pi, po)) = (g, p) else {
        return false;
    };
    if go.len() != 1 || po.len() != 1 {
        // chains: compare their stated values
        return match (stated_value(g), stated_value(p)) {
            (Some(a), Some(b)) => equal(a, b, depth + 1),
            _ => false,
        };
    }
    let (go, po) = (go[0], po[0]);
    if go == RelOp::Eq && po == RelOp::Eq {
        if is_name(&gi[0]) && is_name(&pi[0]) && equal(&gi[0], &pi[0], depth + 1) {
            return equal(&gi[1], &pi[1], depth + 1);
        }
        let gd = Expr::Add(vec![gi[0].clone(), Expr::Neg(Box::new(gi[1].clone()))]);
        let pd = Expr::Add(vec![pi[0].clone(), Expr::Neg(Box::new(pi[1].clone()))]);
        return proportional(&gd, &pd, false);
    }
    if go == po && matches!(go, RelOp::Ne | RelOp::Ratio) {
        return equal(&gi[0], &pi[0], depth + 1) && equal(&gi[1], &pi[1], depth + 1);
    }
    // Inequalities as `d > 0` / `d ≥ 0`.
    let canon = |items: &[Expr], op: RelOp| -> Option<(Expr, bool)> {
        let (hi, lo, strict) = match op {
            RelOp::Gt => (&items[0], &items[1], true),
            RelOp::Ge => (&items[0], &items[1], false),
            RelOp::Lt => (&items[1], &items[0], true),
            RelOp::Le => (&items[1], &items[0], false),
            _ => return None,
        };
        Some((
            Expr::Add(vec![hi.clone(), Expr::Neg(Box::new(lo.clone()))]),
            strict,
        ))
    };
    match (canon(gi, go), canon(pi, po)) {
        (Some((a, sa)), Some((b, sb))) => sa == sb && proportional(&a, &b, true),
        _ => false,
    }
}

/// Whether `a = c·b` for a constant c ≠ 0 (c > 0 when `positive`), at random points.
fn proportional(a: &Expr, b: &Expr, positive: bool) -> bool {
    let mut syms = Vec::new();
    a.symbols(&mut syms);
    b.symbols(&mut syms);
    let mut ratio = None;
    let mut good = 0;
    for k in 0..POINTS {
        let env = point_env(&syms, k);
        let (x, y) = (a.eval(&env), b.eval(&env));
        if !x.is_finite() || !y.is_finite() {
            continue;
        }
        if y.abs() < 1e-12 {
            if x.abs() > 1e-9 {
                return false;
            }
            continue;
        }
        let r = x / y;
        match ratio {
            None => ratio = Some(r),
            Some(r0) if (r - r0).abs() > TOL * r0.abs().max(1.0) => return false,
            _ => {}
        }
        good += 1;
    }
    good >= 2 && ratio.is_some_and(|r| r != 0.0 && (!positive || r > 0.0))
}

/// Deterministic symbol values for evaluation point `k`.
fn point_env(syms: &[String], k: usize) -> impl Fn(&str) -> f64 + '_ {
    move |name: &str| {
        let i = syms.iter().position(|s| s == name).unwrap_or(syms.len());
        point(k, i)
    }
}

/// The value of symbol `i` at evaluation point `k`, in [0.35, 2.45): away from 0 and 1, where
/// different expressions often agree. The first draw of SplitMix64 keyed by `(k, i, 0xA115)`,
/// the numbers `acpo::rng::SplitMix64::from_key` gives (a test of the acpo crate holds the two
/// equal, so no verdict depends on which crate computes them).
pub fn point(k: usize, i: usize) -> f64 {
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let state = [k as u64, i as u64, 0xA115]
        .iter()
        .fold(0x005E_ED0F_AC90_u64, |acc, x| {
            mix(acc.wrapping_add(GOLDEN) ^ mix(x.wrapping_add(GOLDEN)))
        });
    let draw = mix(state.wrapping_add(GOLDEN));
    0.35 + 2.1 * ((draw >> 11) as f64 * (1.0 / (1u64 << 53) as f64))
}

/// Numbers and expressions: a number within [`TOL`] of the gold (module docs, "Numeric
/// tolerance"), the error computed exactly when both are rational, else in f64; expressions with
/// symbols identical at [`POINTS`] random points.
fn value_equal(g: &Expr, p: &Expr) -> bool {
    if let (Some(a), Some(b)) = (g.exact(), p.exact()) {
        if exact::same(&a, &b) {
            return true;
        }
        let Some(error) = exact::add(&b, &-&a) else {
            return false; // the budget refused the subtraction: undecided, so not equal
        };
        // Rounding the exact error to f64 is monotone in it, so the rule stays monotone.
        let error = error.to_f64().unwrap_or(f64::INFINITY).abs();
        let gold = a.to_f64().unwrap_or(f64::INFINITY);
        return error <= tolerance(gold, Gold::exact(a.is_integer()));
    }
    let mut syms = Vec::new();
    g.symbols(&mut syms);
    p.symbols(&mut syms);
    let infinite_meant = g.has_infinity() && p.has_infinity();
    if syms.is_empty() {
        let (x, y) = (g.eval(&|_| f64::NAN), p.eval(&|_| f64::NAN));
        if (x.is_infinite() || y.is_infinite()) && !infinite_meant {
            return false; // an overflow, not a value: undecidable here, so not equal
        }
        let kind = g
            .exact()
            .map_or(Gold::Inexact, |a| Gold::exact(a.is_integer()));
        return within(x, y, kind);
    }
    let mut good = 0;
    for k in 0..POINTS {
        let env = point_env(&syms, k);
        let (x, y) = (g.eval(&env), p.eval(&env));
        if x.is_nan() && y.is_nan() {
            continue;
        }
        if !identical_at(x, y) {
            return false;
        }
        good += 1;
    }
    good >= 3
}

/// How far from the gold value `g` an answer may be: [`TOL`] for an integer gold, [`TOL`]
/// relative to |g| (at least [`TOL`]) for any other, and [`SMALL_GOLD_REL`] relative to |g| for
/// a gold smaller than [`TOL`] / [`SMALL_GOLD_REL`] (10⁻³). It depends on the gold alone, never on how
/// the answer is written, so a smaller error is never rejected where a larger one is accepted.
/// A gold value known only in f64 (an irrational expression) keeps an absolute floor of
/// [`INEXACT_FLOOR`], f64's round-off: `\cos(\frac{\pi}{2})` evaluates to 6·10⁻¹⁷, not 0.
fn tolerance(g: f64, gold: Gold) -> f64 {
    match gold {
        Gold::Integer => TOL,
        _ if g.abs() >= TOL / SMALL_GOLD_REL => TOL * g.abs().max(1.0),
        Gold::Rational => SMALL_GOLD_REL * g.abs(),
        Gold::Inexact => (SMALL_GOLD_REL * g.abs()).max(INEXACT_FLOOR),
    }
}

/// What the gold's value is, for [`tolerance`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gold {
    Integer,
    /// Rational and not an integer: its value is exact.
    Rational,
    /// Known only in f64.
    Inexact,
}

impl Gold {
    fn exact(integer: bool) -> Gold {
        if integer {
            Gold::Integer
        } else {
            Gold::Rational
        }
    }
}

/// The relative tolerance of a small gold (module docs, "Numeric tolerance"): three
/// significant digits, equal to [`TOL`] at |g| = 10⁻³.
const SMALL_GOLD_REL: f64 = 1e-3;

/// The least tolerance of a gold known only in f64 (round-off of an evaluation near 0).
const INEXACT_FLOOR: f64 = 1e-12;

/// Whether two expressions with symbols agree at one evaluation point: as functions they must be
/// identical, so no answer tolerance applies, only f64's round-off ([`EVAL_TOL`] relative).
fn identical_at(x: f64, y: f64) -> bool {
    (x.is_finite() && y.is_finite() && (x - y).abs() <= EVAL_TOL * x.abs().max(1.0))
        || (x.is_infinite() && x == y)
}

/// Whether `y` is within the tolerance of the gold value `x` (infinities only equal themselves).
fn within(x: f64, y: f64, gold: Gold) -> bool {
    if x.is_infinite() || y.is_infinite() {
        return x == y;
    }
    x.is_finite() && y.is_finite() && (x - y).abs() <= tolerance(x, gold)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gold_inequality_accepts_its_interval() {
        // Math-Verify 0.9.0's verdicts on these pairs (gold; answer), each measured
        let boxed = |a: &str| format!("\\boxed{{{a}}}");
        for (gold, answer) in [
            ("x > 2", "(2, \\infty)"),
            ("x \\ge 2", "[2, \\infty)"),
            ("x < 3", "(-\\infty, 3)"),
            ("x \\le -1", "(-\\infty, -1]"),
            ("2 < x", "(2, \\infty)"),
            ("1 < x < 2", "(1, 2)"),
        ] {
            assert!(verify(gold, &boxed(answer)).correct, "{gold} vs {answer}");
        }
        for (gold, answer) in [
            ("x > 2", "[2, \\infty)"),
            ("x > 2", "(3, \\infty)"),
            ("x > 2", "(-\\infty, 2)"),
            ("x \\ge 2", "(2, \\infty)"),
            ("(2, \\infty)", "x > 2"),
        ] {
            assert!(!verify(gold, &boxed(answer)).correct, "{gold} vs {answer}");
        }
    }

    #[test]
    fn a_gold_of_assignments_accepts_the_tuple_of_its_values() {
        // Math-Verify 0.9.0's verdicts, each measured on the pair
        let boxed = |a: &str| format!("\\boxed{{{a}}}");
        for (gold, answer) in [
            ("p = 1, q = 2", "(1, 2)"),
            ("x=1, y=2", "(1,2)"),
            ("p = 1, q = 2", "(2, 1)"),
            ("x = 1, x = 2", "(1, 2)"),
            ("p = 1, q = 2", "1, 2"),
            ("p = 1, q = 2", "\\{1, 2\\}"),
        ] {
            assert!(verify(gold, &boxed(answer)).correct, "{gold} vs {answer}");
        }
        for (gold, answer) in [
            ("p = 1, q = 2", "(1, 2, 3)"),
            ("p = 1, q = 2", "(1, 3)"),
            ("p = 1, q = 2", "(1)"),
        ] {
            assert!(!verify(gold, &boxed(answer)).correct, "{gold} vs {answer}");
        }
    }

    #[test]
    fn a_gold_tuple_accepts_several_answers_in_order() {
        // Math-Verify 0.9.0's verdicts on these pairs (gold; response), each measured
        for (gold, response) in [
            ("(3, 5)", "The answers are \\boxed{3}, \\boxed{5}."),
            ("(3, 5)", "\\boxed{3} and \\boxed{5}"),
            ("(3, 5)", "\\boxed{3, 5}"),
            ("(3, 5)", "(a) \\boxed{3}\n(b) \\boxed{5}"),
            ("(1, 2, 3)", "\\boxed{1}, \\boxed{2}, \\boxed{3}"),
            (
                "\\left(3, \\frac{\\pi}{2}\\right)",
                "\\boxed{3}, \\boxed{\\frac{\\pi}{2}}",
            ),
            ("(2, -1)", "$x = \\boxed{2}$ and $y = \\boxed{-1}$"),
            ("(2, -1)", "\\boxed{x=2}, \\boxed{y=-1}"),
            ("(2, -1)", "\\boxed{x=2, y=-1}"),
            // `\frac12` directly before the joining comma is one half, not \frac of 12,7
            ("\\frac{1}{2}, 7", "\\boxed{\\frac12} and \\boxed{7}"),
        ] {
            assert!(verify(gold, response).correct, "{gold} vs {response}");
        }
        for (gold, response) in [
            ("(3, 5)", "\\boxed{5}, \\boxed{3}"),
            ("(3, 5)", "\\boxed{5, 3}"),
            ("(1, 2, 3)", "\\boxed{1}, \\boxed{3}, \\boxed{2}"),
            ("[3, 5]", "\\boxed{3}, \\boxed{5}"),
            ("(3, 5)", "\\boxed{3}"),
        ] {
            assert!(!verify(gold, response).correct, "{gold} vs {response}");
        }
        // not measured: another count of parts is never the tuple
        assert!(!verify("(3, 5)", "\\boxed{3}, \\boxed{5}, \\boxed{7}").correct);
    }

    #[test]
    fn short_text_answers_joined_by_and_or() {
        // Math-Verify 0.9.0's verdicts on these pairs (gold; response), each measured
        for (gold, response) in [
            ("\\text{Alice and Bob}", "\\boxed{\\text{Alice, Bob}}"),
            ("\\text{Alice, Bob}", "\\boxed{\\text{Alice and Bob}}"),
            ("\\text{yes and no}", "\\boxed{\\text{yes, no}}"),
            ("\\text{red or blue}", "\\boxed{\\text{red, blue}}"),
            ("\\text{red or blue}", "\\boxed{\\text{Red or Blue}}"),
            ("A \\text{ or } C", "\\boxed{C or A}"),
            ("2 \\text{ or } 3", "\\boxed{3, 2}"),
        ] {
            assert!(verify(gold, response).correct, "{gold} vs {response}");
        }
        for (gold, response) in [
            ("\\text{Alice and Bob}", "\\boxed{\\text{Bob and Alice}}"),
            ("\\text{even and odd}", "\\boxed{\\text{odd and even}}"),
            ("\\text{A} \\text{ or } \\text{C}", "\\boxed{C}"),
            ("\\text{A or C}", "\\boxed{A}"),
            ("2 \\text{ or } 3", "\\boxed{2}"),
        ] {
            assert!(!verify(gold, response).correct, "{gold} vs {response}");
        }
        // not measured: a connective alone is a word, and a missing item is still wrong
        assert!(!verify("\\text{and}", "\\boxed{\\text{or}}").correct);
        // items never run together once the connective is gone (measured: Math-Verify refuses)
        assert!(!verify("\\text{I and II}", "\\boxed{III}").correct);
        assert!(!verify("\\text{I and II}", "\\boxed{\\text{III}}").correct);
        assert!(verify("\\text{I and II}", "\\boxed{\\text{I, II}}").correct);
        assert!(verify("\\text{north east}", "\\boxed{\\text{northeast}}").correct);
        assert!(!verify("A \\text{ or } C", "\\boxed{C or B}").correct);
    }

    #[test]
    fn a_matrix_gold_accepts_an_expression_of_matrices() {
        let m = |rows: &str| format!("\\begin{{pmatrix}}{rows}\\end{{pmatrix}}");
        let gold = m("1&2\\\\3&4");
        let boxed = |a: String| format!("\\boxed{{{a}}}");
        for answer in [
            format!("{}+{}", m("1&0\\\\0&1"), m("0&2\\\\3&3")),
            format!("{}-{}", m("2&2\\\\3&5"), m("1&0\\\\0&1")),
            format!("\\frac{{1}}{{2}}{}", m("2&4\\\\6&8")),
            format!("{}{}", m("2&1\\\\4&3"), m("0&1\\\\1&0")),
        ] {
            assert!(verify(&gold, &boxed(answer.clone())).correct, "{answer}");
        }
        for answer in [
            format!("{}+{}", m("1&0\\\\0&1"), m("0&2\\\\3&4")),
            format!("{}{}", m("0&1\\\\1&0"), m("2&1\\\\4&3")),
            format!("{}+{}", m("1&2"), m("0&0\\\\0&0")),
            format!("2{}", m("1&2\\\\3&4")),
        ] {
            assert!(!verify(&gold, &boxed(answer.clone())).correct, "{answer}");
        }
    }

    #[test]
    fn a_small_gold_needs_three_significant_digits() {
        // exact rationals that Math-Verify 0.9.0 tells apart by exact comparison (sympy:
        // Rational(1, 2**98) != Rational(1, 2**99)); six decimal places would take them as 0
        assert!(!verify("\\frac{1}{2^{99}}", "\\boxed{\\frac{1}{2^{98}}}").correct);
        assert!(verify("\\frac{1}{2^{99}}", "\\boxed{2^{-99}}").correct);
        assert!(!verify("1.2 \\cdot 10^{-7}", "\\boxed{1.3 \\cdot 10^{-7}}").correct);
        assert!(!verify("10^{-7}", "\\boxed{0}").correct);
        assert!(verify("1.2 \\cdot 10^{-7}", "\\boxed{1.2 \\cdot 10^{-7}}").correct);
        // within a thousandth of the gold is accepted, monotone in the error
        assert!(verify("1.2345 \\cdot 10^{-5}", "\\boxed{1.235 \\cdot 10^{-5}}").correct);
        assert!(!verify("1.2345 \\cdot 10^{-5}", "\\boxed{1.24 \\cdot 10^{-5}}").correct);
        // from 10^-3 up, six decimal places as before: Math-Verify's roundings are accepted
        assert!(verify("\\frac{1}{3}", "\\boxed{0.333333}").correct);
        assert!(verify("\\frac{1}{7}", "\\boxed{0.142857}").correct);
        assert!(verify("0.1234564", "\\boxed{0.123456}").correct);
        assert!(verify("0.001", "\\boxed{0.0010009}").correct);
        assert!(!verify("0.001", "\\boxed{0.0010011}").correct);
        // integers (every gold of the synthetic task) keep 10^-6, whatever their size
        assert!(verify("0", "\\boxed{10^{-9}}").correct);
        assert!(!verify("0", "\\boxed{0.0000011}").correct);
        // a gold known only in f64 near 0 keeps f64's round-off
        assert!(verify("\\cos(\\frac{\\pi}{2})", "\\boxed{0}").correct);
        assert!(!verify("\\cos(\\frac{\\pi}{2})", "\\boxed{10^{-9}}").correct);
        // the rule's boundary moves with the gold alone: tolerance is continuous at 10^-3
        assert_eq!(tolerance(1e-3, Gold::Rational), TOL);
        assert!((tolerance(0.999e-3, Gold::Rational) - 0.999e-6).abs() < 1e-18);
    }

    #[test]
    fn unicode_spaces_are_spaces_and_invisible_characters_are_gone() {
        // a thousands group written with a no-break, thin or narrow no-break space
        for space in ['\u{a0}', '\u{2009}', '\u{202f}', '\u{2007}'] {
            let answer = format!("\\boxed{{1{space}000}}");
            assert!(verify("1000", &answer).correct, "{answer:?}");
            assert!(!verify("0", &answer).correct, "{answer:?}");
        }
        assert!(verify("x+1", "\\boxed{x\u{a0}+\u{a0}1}").correct);
        // a zero-width character inside a number is not a separator the parser stops at
        for zw in [
            '\u{200b}', '\u{200c}', '\u{200d}', '\u{2060}', '\u{feff}', '\u{ad}',
        ] {
            let answer = format!("\\boxed{{1{zw}2}}");
            assert!(verify("12", &answer).correct, "{answer:?}");
            assert!(!verify("2", &answer).correct, "{answer:?}");
            assert!(!verify("1", &answer).correct, "{answer:?}");
        }
        // the gold is read the same way
        assert!(verify("1\u{a0}000", "\\boxed{1000}").correct);
        assert_eq!(
            normalize_unicode("plain ascii"),
            Cow::Borrowed("plain ascii")
        );
        assert_eq!(normalize_unicode("π\u{2009}r²\u{200b}"), "π r²");
    }
}
