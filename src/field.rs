//! A value refused for one field of an input, in the words every check uses: the manifest's
//! validator (which adds the file) and the rules that check their own fields (a clipping rule,
//! [`crate::algo::clip::PolicyClip::from_fields`]) word a refusal the same way.

/// A field and why its value is refused (`must not be set for grpo-ac: ...`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("field `{field}`: {reason}")]
pub struct FieldError {
    /// The field's dotted path (`algorithm.alpha`).
    pub field: String,
    /// The sentence after the field's name.
    pub reason: String,
}

pub type Checked<T> = Result<T, FieldError>;

/// Refuses `field` with `reason`.
pub fn fail<T>(field: &str, reason: impl Into<String>) -> Checked<T> {
    Err(FieldError {
        field: field.to_owned(),
        reason: reason.into(),
    })
}

/// The value of a field that must be set; `why` says for what (`for ppo`).
pub fn required<T: Copy>(field: &str, value: Option<T>, why: &str) -> Checked<T> {
    match value {
        Some(v) => Ok(v),
        None => fail(field, format!("is required {why}")),
    }
}

/// A field that must not be set; `why` says when and why not.
pub fn forbidden<T>(field: &str, value: &Option<T>, why: &str) -> Checked<()> {
    if value.is_some() {
        return fail(field, format!("must not be set {why}"));
    }
    Ok(())
}

/// A finite number in [lo, hi], `range` as the message writes it (`[0, 1]`).
pub fn finite_in(field: &str, value: f64, lo: f64, hi: f64, range: &str) -> Checked<f64> {
    if !value.is_finite() || value < lo || value > hi {
        return fail(field, format!("must be in {range}, got {}", number(value)));
    }
    Ok(value)
}

/// A finite number > 0.
pub fn strictly_positive(field: &str, value: f64) -> Checked<f64> {
    if !value.is_finite() || value <= 0.0 {
        return fail(
            field,
            format!("must be a finite number > 0, got {}", number(value)),
        );
    }
    Ok(value)
}

/// A number as a message shows it: plain when short, in exponent form when huge or tiny.
pub fn number(x: f64) -> String {
    let a = x.abs();
    if a != 0.0 && !(1e-4..1e9).contains(&a) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}
