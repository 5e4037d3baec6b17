//! The reward (paper Section 5, docs/ARCHITECTURE.md: the verifier is the only judge): a response's tokens
//! are decoded, judged by [`crate::verify::verify`] against the gold answer, and scored 1 / 0
//! (`binary`, Math-Verify's score) or ±1 (`signed`, verl's DAPO scorer). Training rollouts, the
//! difficulty probe, the evaluator and `acpo score` all judge through this module.

use crate::files::AtPath;
use serde::{Deserialize, Serialize};
use std::path::Path;

use crate::model::score::ScoreError;
use crate::model::tokenizer::Tokenizer;
use crate::verify::{self, Verdict};

/// The reward for a verified answer. The paper does not say which scale it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RewardKind {
    /// 1 correct, 0 otherwise (Math-Verify's score).
    Binary,
    /// +1 correct, −1 otherwise (verl's DAPO scorer).
    Signed,
}

/// A decoded response and its verdict.
#[derive(Debug, Clone)]
pub struct Judged {
    pub response: String,
    pub verdict: Verdict,
}

/// Decodes `tokens` (special tokens dropped) and judges the text against `gold`.
pub fn judge(tokenizer: &Tokenizer, tokens: &[u32], gold: &str) -> crate::model::Result<Judged> {
    let response = tokenizer.decode(tokens, true)?;
    let verdict = verify::verify(gold, &response);
    Ok(Judged { response, verdict })
}

/// The scalar reward of a verdict.
pub fn score(kind: RewardKind, correct: bool) -> f32 {
    match (kind, correct) {
        (RewardKind::Binary, true) | (RewardKind::Signed, true) => 1.0,
        (RewardKind::Binary, false) => 0.0,
        (RewardKind::Signed, false) => -1.0,
    }
}

/// A JSONL file of responses, each line with `correct`, `extracted` (and `error`) added.
#[derive(Debug, Clone)]
pub struct ScoredFile {
    pub lines: String,
    pub responses: usize,
    pub correct: usize,
    pub errors: usize,
}

impl ScoredFile {
    /// One line for the user.
    pub fn summary(&self) -> String {
        format!(
            "scored {} responses: {} correct ({:.2} %), {} with a verifier error",
            self.responses,
            self.correct,
            100.0 * self.correct as f64 / self.responses.max(1) as f64,
            self.errors
        )
    }
}

/// Judges responses made anywhere (vLLM, verl dumps): JSONL with a `response` and an `answer`
/// string per line (a numeric answer is taken as written).
pub fn score_file(path: &Path) -> Result<ScoredFile, ScoreError> {
    let text = crate::files::read_to_string(path).at(path)?;
    let mut out = ScoredFile {
        lines: String::new(),
        responses: 0,
        correct: 0,
        errors: 0,
    };
    for (line, v) in crate::jsonl::values(&text) {
        let bad = |reason: String| ScoreError::Line {
            path: path.to_owned(),
            line,
            reason,
        };
        let mut v = v.map_err(|_| bad("not a JSON object".into()))?;
        let obj = v
            .as_object_mut()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        let field = |name: &str| match obj.get(name) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(serde_json::Value::Number(x)) if name == "answer" => Ok(x.to_string()),
            _ => Err(bad(format!("field `{name}` (a string) is missing"))),
        };
        let (response, answer) = (field("response")?, field("answer")?);
        let verdict = verify::verify(&answer, &response);
        out.responses += 1;
        out.correct += usize::from(verdict.correct);
        obj.insert("correct".into(), verdict.correct.into());
        obj.insert("extracted".into(), verdict.extracted.clone().into());
        if let Some(e) = &verdict.error {
            out.errors += 1;
            obj.insert("error".into(), e.clone().into());
        }
        out.lines.push_str(&v.to_string());
        out.lines.push('\n');
    }
    if out.responses == 0 {
        return Err(ScoreError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(out)
}
