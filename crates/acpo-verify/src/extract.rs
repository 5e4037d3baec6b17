//! Finding the final answer in a model response, in Math-Verify's priority order:
//! 1. `\boxed{…}` / `\fbox{…}` (balanced braces; the last one, joined with the boxes just before
//!    it when only a few connecting words separate them: "\boxed{1} and \boxed{2}");
//! 2. DAPO's `Answer: …` on the last such line;
//! 3. "final answer is …";
//! 4. the last display or inline LaTeX block (`\[…\]`, `$$…$$`, `\(…\)`, `$…$`; inline blocks may
//!    not span lines);
//! 5. the last plain number.
//!
//! Every scan is linear in the input and bounded by [`MAX_INPUT`]; nothing recurses.

/// Longest input examined (the tail of longer responses, where the answer is).
pub const MAX_INPUT: usize = 200_000;

/// Where an extracted answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    Boxed,
    AnswerLine,
    FinalAnswer,
    Latex,
    Number,
    /// The whole text (gold answers written without delimiters).
    Whole,
}

/// One candidate answer, still LaTeX text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub text: String,
    pub source: Source,
}

/// The tail of `text` that is examined, cut on a char boundary.
fn tail(text: &str) -> &str {
    if text.len() <= MAX_INPUT {
        return text;
    }
    let mut start = text.len() - MAX_INPUT;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Contents of every `\boxed{…}` / `\fbox{…}` with its byte span, in order.
pub fn boxed_spans(text: &str) -> Vec<(usize, usize, String)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let skip = if rest.starts_with(b"\\boxed") {
            6
        } else if rest.starts_with(b"\\fbox") {
            5
        } else {
            i += 1;
            continue;
        };
        let mut j = i + skip;
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        if j < bytes.len() && bytes[j] == b'{' {
            let mut depth = 0usize;
            let mut k = j;
            let mut end = None;
            while k < bytes.len() {
                match bytes[k] {
                    b'\\' => k += 1, // skip the escaped char (\{ \})
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(k);
                            break;
                        }
                    }
                    _ => {}
                }
                k += 1;
            }
            if let Some(e) = end {
                out.push((i, e + 1, text[j + 1..e].to_string()));
                i = e + 1;
                continue;
            }
            // Unclosed: the rest of the text is the content (a truncated response).
            out.push((i, bytes.len(), text[j + 1..].to_string()));
            break;
        } else if j < bytes.len() && !bytes[j].is_ascii_alphabetic() {
            // \boxed 5
            let s = j;
            let mut e = j;
            while e < bytes.len() && !bytes[e].is_ascii_whitespace() && bytes[e] != b'$' {
                e += 1;
            }
            if e > s {
                out.push((i, e, text[s..e].to_string()));
            }
            i = e.max(i + 1);
            continue;
        }
        i += skip;
    }
    out
}

/// Whether the text between two boxes only connects them ("and", ",", "\quad", a unit word…).
fn connects(between: &str) -> bool {
    let mut s = between.to_string();
    for pat in [
        "\\text", "\\mathrm", "\\quad", "\\qquad", "\\(", "\\)", "\\[", "\\]", "$", "{", "}",
        "\\,", "\\;", "\\ ",
    ] {
        s = s.replace(pat, " ");
    }
    let words = s
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .count();
    words <= 4 && s.chars().filter(|c| c.is_ascii_digit()).count() == 0
}

/// The boxed answer: the last box, joined with directly preceding connected boxes.
fn boxed_answer(text: &str) -> Option<String> {
    let spans = boxed_spans(text);
    let last = spans.last()?;
    let mut parts = vec![last.2.clone()];
    let mut k = spans.len() - 1;
    while k > 0 {
        let (prev, cur) = (&spans[k - 1], &spans[k]);
        if !connects(&text[prev.1..cur.0]) {
            break;
        }
        parts.push(prev.2.clone());
        k -= 1;
    }
    parts.reverse();
    Some(parts.join(","))
}

/// Content after the last `Answer:` (case-insensitive) up to the end of its line.
fn answer_line(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let pos = lower.rfind("answer:")?;
    let rest = &text[pos + "answer:".len()..];
    let line = rest.lines().next().unwrap_or("").trim();
    (!line.is_empty()).then(|| line.to_string())
}

/// Content after the last "final answer is" up to the end of the sentence/line.
fn final_answer(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let key = "answer is";
    let pos = lower.rfind(key)?;
    let rest = text[pos + key.len()..].trim_start_matches([':', ' ']);
    let line = rest.lines().next().unwrap_or("").trim();
    // up to the end of the sentence: ". " (a decimal point is followed by a digit)
    let line = line.split(". ").next().unwrap_or(line);
    let line = line.strip_suffix('.').unwrap_or(line).trim();
    (!line.is_empty()).then(|| line.to_string())
}

/// The last LaTeX math block.
pub fn last_latex_block(text: &str) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    let mut consider = |start: usize, content: &str| {
        if !content.trim().is_empty() && best.as_ref().is_none_or(|(s, _)| start > *s) {
            best = Some((start, content.to_string()));
        }
    };
    for (open, close, multiline) in [
        ("\\[", "\\]", true),
        ("$$", "$$", true),
        ("\\(", "\\)", false),
    ] {
        let mut from = 0;
        while let Some(s) = text[from..].find(open) {
            let s = from + s;
            let body = s + open.len();
            let Some(e) = text[body..].find(close) else {
                break;
            };
            let content = &text[body..body + e];
            if multiline || !content.contains('\n') {
                consider(s, content);
            }
            from = body + e + close.len();
        }
    }
    // Single-dollar inline math: pair up `$` that are not part of `$$` or escaped.
    let bytes = text.as_bytes();
    let mut open: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if bytes[i] == b'$' {
            if i + 1 < bytes.len() && bytes[i + 1] == b'$' {
                i += 2;
                open = None;
                continue;
            }
            match open {
                None => open = Some(i),
                Some(s) => {
                    let content = &text[s + 1..i];
                    if !content.contains('\n') {
                        consider(s, content);
                    }
                    open = None;
                }
            }
        }
        i += 1;
    }
    best.map(|(_, c)| c)
}

/// The last number in plain text (thousands separators and a leading sign kept).
pub fn last_number(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut best = None;
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit()
            || (chars[i] == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit));
        let glued = i > 0 && chars[i - 1].is_alphabetic();
        if !starts || glued {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len()
            && (chars[j].is_ascii_digit()
                || ((chars[j] == ',' || chars[j] == '.' || chars[j] == ' ' || chars[j] == '/')
                    && chars.get(j + 1).is_some_and(char::is_ascii_digit)
                    && (chars[j] != ' '
                        || chars
                            .get(j + 1..j + 4)
                            .is_some_and(|g| g.iter().all(char::is_ascii_digit))
                            && chars.get(j + 4).is_none_or(|c| !c.is_ascii_digit()))))
        {
            j += 1;
        }
        let neg = i > 0 && chars[i - 1] == '-';
        let s: String = chars[i..j].iter().collect();
        best = Some(if neg { format!("-{s}") } else { s });
        i = j.max(i + 1);
    }
    best
}

/// The later of the last LaTeX block and the last number (Math-Verify picks by position among
/// them), with which one it was.
fn last_math(text: &str) -> Option<(String, Source)> {
    let block = last_latex_block_at(text);
    let number = last_number_at(text);
    match (block, number) {
        (Some((be, b)), Some((ne, n))) => Some(if ne > be {
            (n, Source::Number)
        } else {
            (b, Source::Latex)
        }),
        (Some((_, b)), None) => Some((b, Source::Latex)),
        (None, Some((_, n))) => Some((n, Source::Number)),
        (None, None) => None,
    }
}

fn last_number_at(text: &str) -> Option<(usize, String)> {
    let n = last_number(text)?;
    let digits = n.trim_start_matches('-');
    // byte end of the last occurrence of the number's digits
    let end = text.rfind(digits.chars().last()?)? + 1;
    Some((end, n))
}

fn last_latex_block_at(text: &str) -> Option<(usize, String)> {
    let b = last_latex_block(text)?;
    let end = text.rfind(b.as_str())? + b.len();
    Some((end, b))
}

/// The answer stated on an answer line: its box, the whole line when it is math
/// (`Answer: \\frac{14}{3}`), else the last math in it ("the largest $n$ is 34").
fn line_answer(line: &str) -> Option<String> {
    if let Some(b) = boxed_answer(line) {
        return Some(b);
    }
    if is_math_like(line) {
        return Some(line.to_string());
    }
    last_math(line).map(|m| m.0)
}

/// No delimiters and no prose: no run of 4+ letters outside LaTeX commands.
fn is_math_like(line: &str) -> bool {
    // Arguments of \begin, \end, \text, \mbox, \mathrm name things; they are not prose.
    let mut stripped = line.replace("\\$", "");
    for cmd in [
        "\\begin{",
        "\\end{",
        "\\text{",
        "\\mbox{",
        "\\mathrm{",
        "\\textbf{",
    ] {
        while let Some(s) = stripped.find(cmd) {
            let close = stripped[s..]
                .find('}')
                .map_or(stripped.len(), |e| s + e + 1);
            stripped.replace_range(s..close, " ");
        }
    }
    let line = stripped.as_str();
    if line.contains('$') || line.contains("\\(") || line.contains("\\[") {
        return false;
    }
    let mut run = 0;
    let mut in_cmd = false;
    for c in line.chars() {
        if c == '\\' {
            in_cmd = true;
            run = 0;
        } else if c.is_alphabetic() {
            if !in_cmd {
                run += 1;
                if run >= 4 {
                    return false;
                }
            }
        } else {
            in_cmd = false;
            run = 0;
        }
    }
    true
}

/// Answer candidates of a response, best first (at most one per source).
pub fn candidates(response: &str) -> Vec<Candidate> {
    let unescaped = unescape(tail(response));
    let text = unescaped.as_str();
    let mut out = Vec::new();
    let mut push = |t: Option<String>, source| {
        if let Some(t) = t {
            if !t.trim().is_empty() {
                out.push(Candidate { text: t, source });
            }
        }
    };
    // "The final answer is $10,455$" outranks an earlier box (Math-Verify's order).
    if let Some(line) = final_answer(text) {
        push(line_answer(&line), Source::FinalAnswer);
    }
    push(boxed_answer(text), Source::Boxed);
    if let Some(line) = answer_line(text) {
        push(line_answer(&line).or(Some(line)), Source::AnswerLine);
    }
    let structured = !out.is_empty();
    // A short prediction that is itself LaTeX ("\\frac{10}{9}") is its own answer.
    if !structured
        && text.len() <= 300
        && text.contains('\\')
        && !text.contains('$')
        && last_latex_block(text).is_none()
    {
        out.push(Candidate {
            text: text.to_string(),
            source: Source::Whole,
        });
    }
    if let Some((m, source)) = last_math(text) {
        out.push(Candidate { text: m, source });
    }
    out.retain(|c| !c.text.trim().is_empty());
    out
}

/// Candidates for a gold answer: its boxed or delimited content if it has any, else the whole.
pub fn gold_candidates(gold: &str) -> Vec<Candidate> {
    let unescaped = unescape(tail(gold));
    let text = unescaped.as_str();
    let mut out = Vec::new();
    if let Some(b) = boxed_answer(text) {
        out.push(Candidate {
            text: b,
            source: Source::Boxed,
        });
    } else if let Some(l) = last_latex_block(text)
        .filter(|_| text.contains('$') || text.contains("\\[") || text.contains("\\("))
    {
        // "$1$ and $2$": several inline blocks that only connect → a list.
        let blocks = all_inline_blocks(text);
        if blocks.len() > 1 && connects(&strip_blocks(text)) {
            out.push(Candidate {
                text: blocks.join(","),
                source: Source::Latex,
            });
        } else {
            out.push(Candidate {
                text: l,
                source: Source::Latex,
            });
        }
    }
    out.push(Candidate {
        text: text.to_string(),
        source: Source::Whole,
    });
    out
}

/// Undoes one level of backslash escaping (`\\\\boxed` → `\\boxed`) when a text was
/// JSON-escaped twice: a double backslash directly before a letter is a command, not a row break.
fn unescape(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    let mut i = 0;
    while i + 2 < b.len() {
        if b[i] == b'\\'
            && b[i + 1] == b'\\'
            && b[i + 2].is_ascii_alphabetic()
            && (i == 0 || b[i - 1] != b'\\')
        {
            out.push_str(&text[last..i]);
            last = i + 1;
            i += 2;
            continue;
        }
        i += 1;
    }
    out.push_str(&text[last..]);
    out
}

fn all_inline_blocks(text: &str) -> Vec<String> {
    text.split('$')
        .enumerate()
        .filter(|(i, s)| i % 2 == 1 && !s.trim().is_empty())
        .map(|(_, s)| s.to_string())
        .collect()
}

fn strip_blocks(text: &str) -> String {
    text.split('$')
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, s)| s)
        .collect::<Vec<_>>()
        .join(" ")
}
