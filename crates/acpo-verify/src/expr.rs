//! LaTeX answers as expression trees: normalisation, a bounded recursive-descent parser, exact
//! rational evaluation and numeric evaluation at given symbol values.
//!
//! Bounds: input length [`MAX_LEN`], nesting depth [`MAX_DEPTH`] (brackets, postfix `%` and `!`,
//! chained powers), exact values up to `MAX_EXACT_BITS` bits, and the judgement's work budget
//! ([`super::work`]) charged by every exact operation and every evaluated node. Anything beyond
//! them is a parse error or a refused value, never a hang or a panic.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, ToPrimitive, Zero};

use super::{exact, work};

pub const MAX_LEN: usize = 4_000;
pub const MAX_DEPTH: usize = 64;
/// The largest exact value (numerator and denominator bits) computed; larger ones are left to
/// numeric evaluation.
const MAX_EXACT_BITS: u64 = 200_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Approx,
    In,
    Ratio,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// An exact number; `places` = digits after the decimal point when written as a decimal.
    Num {
        value: BigRational,
        places: Option<u32>,
    },
    Sym(String),
    Pi,
    E,
    Inf,
    Add(Vec<Expr>),
    Mul(Vec<Expr>),
    Neg(Box<Expr>),
    Div(Box<Expr>, Box<Expr>),
    Pow(Box<Expr>, Box<Expr>),
    /// A named function: sin, cos, …, sqrt, root (index, radicand), abs, fact, or an unknown f.
    Func(String, Vec<Expr>),
    /// a ± b
    Pm(Box<Expr>, Box<Expr>),
    Percent(Box<Expr>),
    /// Parenthesised or bracketed sequence: tuples and intervals (`(`/`[` … `)`/`]`).
    Seq {
        open: char,
        close: char,
        items: Vec<Expr>,
    },
    Set(Vec<Expr>),
    /// A top-level list (commas, semicolons, "and"/"or").
    List(Vec<Expr>),
    Union(Vec<Expr>),
    Matrix(Vec<Vec<Expr>>),
    /// A chain `e0 op0 e1 op1 e2 …`.
    Rel(Vec<Expr>, Vec<RelOp>),
    Text(String),
}

/// Why an answer could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

fn perr<T>(msg: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError(msg.into()))
}

/// Rewrites equivalent LaTeX spellings to one form before tokenising.
pub fn normalize(s: &str) -> String {
    // Matrix row breaks first, so that `\\ ` is not read as an escaped space.
    let mut t = s.trim().replace("\\\\", "⏎");
    for (from, to) in [
        ("{,}", ","),
        (",\\! ", ","),
        (",\\!", ","),
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", " "),
        ("\\;", " "),
        ("\\:", " "),
        ("\\qquad", " "),
        ("\\quad", " "),
        ("\\displaystyle", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("\\cfrac", "\\frac"),
        ("\\dbinom", "\\binom"),
        ("\\tbinom", "\\binom"),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\circ", ""),
        ("°", ""),
        ("\\degree", ""),
        ("\\$", ""),
        ("$", ""),
        ("\\%", "%"),
        ("\\leq", "≤"),
        ("\\geq", "≥"),
        ("\\le", "≤"),
        ("\\ge", "≥"),
        ("\\lt", "<"),
        ("\\gt", ">"),
        ("\\neq", "≠"),
        ("\\ne", "≠"),
        ("<=", "≤"),
        (">=", "≥"),
        ("!=", "≠"),
        ("\\approx", "≈"),
        ("\\infty", "∞"),
        ("\\emptyset", "∅"),
        ("\\varnothing", "∅"),
        ("\\ ", " "),
        ("~", " "),
        ("\\{", "⦃"),
        ("\\}", "⦄"),
        ("\\lbrace", "⦃"),
        ("\\rbrace", "⦄"),
    ] {
        t = t.replace(from, to);
    }
    t.trim().trim_end_matches(['.', ' ']).trim().to_string()
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(String),
    Ident(String),
    Cmd(String),
    Text(String),
    Op(char),
    Rel(RelOp),
    Env(String, String),
}

/// Splits LaTeX / plain math into tokens: one loop with an arm per kind of lexeme. Numbers
/// ([`lex_number`]) and `\commands` ([`lex_command`]) have their own lexers, which return where
/// the lexeme ends; words, relations and operators are lexed here.
fn tokenize(s: &str) -> Result<Vec<Tok>, ParseError> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    // Inside ( ) or [ ] a comma separates items: no thousands or decimal commas there.
    let mut brackets = 0usize;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        match c {
            '(' | '[' => brackets += 1,
            ')' | ']' => brackets = brackets.saturating_sub(1),
            _ => {}
        }
        if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // `\frac12,7`: the digits after `\frac` are its two arguments, never a number with
            // a decimal or thousands comma (12,7), so they lex as inside brackets.
            let args = matches!(out.last(), Some(Tok::Cmd(c)) if c == "frac" || c == "binom");
            i = lex_number(&chars, i, brackets + usize::from(args), &mut out)?;
            continue;
        }
        if c == '\\' {
            i = lex_command(&chars, i, &mut out)?;
            continue;
        }
        if c.is_alphabetic() {
            // A word of 2+ letters in running text: "and", "or", units, "percent".
            let mut j = i;
            while j < chars.len() && chars[j].is_alphabetic() {
                j += 1;
            }
            let word: String = chars[i..j].iter().collect();
            match word.to_ascii_lowercase().as_str() {
                "and" | "or" => out.push(Tok::Op(',')),
                "percent" | "percentage" | "pct" => out.push(Tok::Op('%')),
                _ => {
                    for ch in word.chars() {
                        out.push(Tok::Ident(ch.to_string()));
                    }
                }
            }
            i = j;
            continue;
        }
        let tok = match c {
            '≤' => Tok::Rel(RelOp::Le),
            '≥' => Tok::Rel(RelOp::Ge),
            '<' => Tok::Rel(RelOp::Lt),
            '>' => Tok::Rel(RelOp::Gt),
            '≠' => Tok::Rel(RelOp::Ne),
            '≈' => Tok::Rel(RelOp::Approx),
            '=' => Tok::Rel(RelOp::Eq),
            ':' => Tok::Rel(RelOp::Ratio),
            '∞' => Tok::Cmd("infty".into()),
            '×' | '·' => Tok::Op('*'),
            '⏎' => Tok::Op('⏎'),
            '−' => Tok::Op('-'),
            _ => Tok::Op(c),
        };
        out.push(tok);
        i += 1;
    }
    Ok(out)
}

/// A number from `chars[i]`: digits with thousands groups (7,425,000 / 1 000), a decimal point
/// or a decimal comma, and scientific notation (4.5e33 as 4.5 * 10^{33}). Returns where it ends.
fn lex_number(
    chars: &[char],
    i: usize,
    brackets: usize,
    out: &mut Vec<Tok>,
) -> Result<usize, ParseError> {
    let mut j = i;
    let mut num = String::new();
    while j < chars.len() {
        let d = chars[j];
        if d.is_ascii_digit() || d == '.' {
            num.push(d);
            j += 1;
        } else if d == ',' && brackets == 0 && thousands_group(chars, j) {
            j += 1; // 7,425,000
        } else if d == ' ' && space_group(chars, j) {
            j += 1; // 1 000
        } else {
            break;
        }
    }
    // A decimal comma (1000,99 / 0,111) when the whole number is written that way.
    if j < chars.len()
        && chars[j] == ','
        && brackets == 0
        && !num.contains('.')
        && decimal_comma(chars, j, &num)
    {
        num.push('.');
        j += 1;
        while j < chars.len() && chars[j].is_ascii_digit() {
            num.push(chars[j]);
            j += 1;
        }
    }
    if num.matches('.').count() > 1 {
        return perr(format!("malformed number `{num}`"));
    }
    // Scientific notation: 4.5e33, 1E-7 (an `e` glued to the number, then digits).
    if matches!(chars.get(j), Some('e' | 'E')) {
        let mut k = j + 1;
        if matches!(chars.get(k), Some('+' | '-')) {
            k += 1;
        }
        let start = k;
        while k < chars.len() && chars[k].is_ascii_digit() {
            k += 1;
        }
        if k > start && k - start <= 4 && chars.get(k).is_none_or(|c| !c.is_alphanumeric()) {
            let exp: String = chars[j + 1..k].iter().collect();
            out.push(Tok::Num(num));
            out.push(Tok::Op('*'));
            out.push(Tok::Num("10".into()));
            out.push(Tok::Op('^'));
            out.push(Tok::Op('{'));
            if let Some(e) = exp.strip_prefix('-') {
                out.push(Tok::Op('-'));
                out.push(Tok::Num(e.into()));
            } else {
                out.push(Tok::Num(exp.trim_start_matches('+').into()));
            }
            out.push(Tok::Op('}'));
            return Ok(k);
        }
    }
    out.push(Tok::Num(num));
    Ok(j)
}

/// A `\command` from `chars[i]`: text-like commands with their braced argument, environments
/// up to their `\end`, operators and relations spelled as commands. Returns where it ends.
fn lex_command(chars: &[char], i: usize, out: &mut Vec<Tok>) -> Result<usize, ParseError> {
    let mut j = i + 1;
    while j < chars.len() && chars[j].is_ascii_alphabetic() {
        j += 1;
    }
    if j == i + 1 {
        // \\ (matrix row) or an escaped symbol
        let sym = chars.get(i + 1).copied().unwrap_or(' ');
        out.push(Tok::Op(if sym == '\\' { '⏎' } else { sym }));
        return Ok(i + 2);
    }
    let name: String = chars[i + 1..j].iter().collect();
    let next = match name.as_str() {
        "text" | "textbf" | "textit" | "mathrm" | "textnormal" | "mbox" | "mathbf"
        | "operatorname" | "mathit" | "textrm" => {
            let (content, next) = braced(chars, j)?;
            let c = content.trim().to_string();
            match c.as_str() {
                "and" | "or" | "," => out.push(Tok::Op(',')),
                _ if c.chars().count() == 1 || name == "operatorname" => {
                    out.extend(tokenize(&c)?);
                }
                _ => out.push(Tok::Text(c)),
            }
            next
        }
        "begin" => {
            let (env, next) = braced(chars, j)?;
            let end_tag: Vec<char> = format!("\\end{{{env}}}").chars().collect();
            let mut k = next;
            let mut found = None;
            while k + end_tag.len() <= chars.len() {
                if chars[k..k + end_tag.len()] == end_tag[..] {
                    found = Some(k);
                    break;
                }
                k += 1;
            }
            let Some(e) = found else {
                return perr(format!("\\begin{{{env}}} without \\end"));
            };
            let mut body: String = chars[next..e].iter().collect();
            if env == "array" {
                // drop the column spec {cc}
                if let Some(rest) = body.trim_start().strip_prefix('{') {
                    body = rest
                        .split_once('}')
                        .map(|x| x.1.to_string())
                        .unwrap_or_default();
                }
            }
            out.push(Tok::Env(env, body));
            e + end_tag.len()
        }
        "cdot" | "times" | "ast" => {
            out.push(Tok::Op('*'));
            j
        }
        "div" => {
            out.push(Tok::Op('/'));
            j
        }
        "pm" | "mp" => {
            out.push(Tok::Op('±'));
            j
        }
        "in" => {
            out.push(Tok::Rel(RelOp::In));
            j
        }
        "cup" => {
            out.push(Tok::Op('∪'));
            j
        }
        "mid" | "vert" | "lvert" | "rvert" => {
            out.push(Tok::Op('|'));
            j
        }
        "implies" | "Rightarrow" | "therefore" => {
            out.push(Tok::Op(','));
            j
        }
        _ => {
            out.push(Tok::Cmd(name));
            j
        }
    };
    Ok(next)
}

fn thousands_group(chars: &[char], comma: usize) -> bool {
    // ,ddd followed by a non-digit, and the digits before the comma form a valid group
    let after = chars.get(comma + 1..comma + 4);
    let ok_after = after.is_some_and(|g| g.iter().all(char::is_ascii_digit))
        && chars.get(comma + 4).is_none_or(|c| !c.is_ascii_digit());
    if !ok_after {
        return false;
    }
    let mut k = comma;
    let mut digits = 0;
    while k > 0 && chars[k - 1].is_ascii_digit() {
        k -= 1;
        digits += 1;
    }
    let lead_ok = chars[k] != '0';
    (1..=3).contains(&digits) && lead_ok || (digits == 3 && k > 0 && chars[k - 1] == ',')
}

fn space_group(chars: &[char], space: usize) -> bool {
    let before = space >= 1 && chars[space - 1].is_ascii_digit();
    let mut k = space;
    let mut digits = 0;
    while k > 0 && chars[k - 1].is_ascii_digit() {
        k -= 1;
        digits += 1;
    }
    before
        && (1..=3).contains(&digits)
        && (k == 0 || !chars[k - 1].is_ascii_digit() && chars[k - 1] != ',' && chars[k - 1] != '.')
        && chars
            .get(space + 1..space + 4)
            .is_some_and(|g| g.iter().all(char::is_ascii_digit))
        && chars
            .get(space + 4)
            .is_none_or(|c| !c.is_ascii_digit() && *c != '.')
        && chars.iter().all(|c| c.is_ascii_digit() || *c == ' ')
}

fn decimal_comma(chars: &[char], comma: usize, int_part: &str) -> bool {
    let mut k = comma + 1;
    while k < chars.len() && chars[k].is_ascii_digit() {
        k += 1;
    }
    let frac = k - comma - 1;
    let nothing_after = chars[k..].iter().all(|c| !c.is_ascii_digit() && *c != ',');
    nothing_after
        && frac >= 1
        && (frac != 3 || int_part == "0" || int_part.len() > 3)
        && !(frac == 1 && int_part.len() == 1)
}

/// `{…}` starting at `start` (skipping spaces); returns the content and the index after `}`.
fn braced(chars: &[char], start: usize) -> Result<(String, usize), ParseError> {
    let mut i = start;
    while i < chars.len() && chars[i] == ' ' {
        i += 1;
    }
    if i >= chars.len() || chars[i] != '{' {
        // \text x → one char
        return match chars.get(i) {
            Some(c) => Ok((c.to_string(), i + 1)),
            None => perr("missing argument"),
        };
    }
    let mut depth = 0;
    for (k, c) in chars.iter().enumerate().skip(i) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Ok((chars[i + 1..k].iter().collect(), k + 1));
                }
            }
            _ => {}
        }
    }
    perr("unbalanced braces")
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
}

const FUNCS: [&str; 20] = [
    "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "ln", "log", "exp", "lg", "max", "min", "gcd", "det",
];

const GREEK: [&str; 24] = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
];

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn eat_op(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Op(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return perr("nesting too deep");
        }
        Ok(())
    }

    /// list := rel (("," | ";") rel)*
    fn list(&mut self, closers: &[char]) -> Result<Vec<Expr>, ParseError> {
        let mut items = Vec::new();
        loop {
            while self.eat_op(',') || self.eat_op(';') {}
            match self.peek() {
                None => break,
                Some(Tok::Op(c)) if closers.contains(c) => break,
                _ => {}
            }
            let before = self.pos;
            items.push(self.union()?);
            if self.pos == before {
                return perr("unexpected token");
            }
            if !(self.eat_op(',') || self.eat_op(';')) {
                match self.peek() {
                    None => break,
                    Some(Tok::Op(c)) if closers.contains(c) => break,
                    _ => {}
                }
            }
        }
        Ok(items)
    }

    fn union(&mut self) -> Result<Expr, ParseError> {
        let first = self.relation()?;
        if self.peek() != Some(&Tok::Op('∪')) {
            return Ok(first);
        }
        let mut parts = vec![first];
        while self.eat_op('∪') {
            parts.push(self.relation()?);
        }
        Ok(Expr::Union(parts))
    }

    fn relation(&mut self) -> Result<Expr, ParseError> {
        let first = self.ratio()?;
        let mut items = vec![first];
        let mut ops = Vec::new();
        while let Some(Tok::Rel(op)) = self.peek().cloned() {
            self.pos += 1;
            ops.push(op);
            items.push(self.ratio()?);
        }
        Ok(if ops.is_empty() {
            items.pop().expect("invariant: one item")
        } else {
            Expr::Rel(items, ops)
        })
    }

    /// `a : b : c` (ratios, clock times) as an ordered sequence.
    fn ratio(&mut self) -> Result<Expr, ParseError> {
        let first = self.additive()?;
        if self.peek() != Some(&Tok::Rel(RelOp::Ratio)) {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.peek() == Some(&Tok::Rel(RelOp::Ratio)) {
            self.pos += 1;
            items.push(self.additive()?);
        }
        Ok(Expr::Seq {
            open: ':',
            close: ':',
            items,
        })
    }

    fn additive(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let mut terms = Vec::new();
        let mut first = true;
        let mut pm: Option<Expr> = None;
        loop {
            let sign = if self.eat_op('+') {
                1
            } else if self.eat_op('-') {
                -1
            } else if self.eat_op('±') {
                2
            } else if first {
                1
            } else {
                break;
            };
            first = false;
            let t = self.term()?;
            match sign {
                1 => terms.push(t),
                -1 => terms.push(Expr::Neg(Box::new(t))),
                _ => {
                    let base = std::mem::take(&mut terms);
                    let left = if base.is_empty() {
                        Expr::zero()
                    } else {
                        Expr::sum(base)
                    };
                    pm = Some(Expr::Pm(Box::new(left), Box::new(t)));
                }
            }
        }
        self.depth -= 1;
        Ok(match pm {
            Some(Expr::Pm(a, b)) if !terms.is_empty() => {
                let rest = Expr::sum(terms);
                Expr::Pm(Box::new(Expr::sum(vec![*a, rest])), b)
            }
            Some(p) => p,
            None if terms.is_empty() => return perr("empty expression"),
            None => Expr::sum(terms),
        })
    }

    fn starts_primary(&self) -> bool {
        match self.peek() {
            Some(Tok::Num(_) | Tok::Ident(_) | Tok::Env(..) | Tok::Text(_)) => true,
            Some(Tok::Cmd(c)) => !matches!(c.as_str(), "end"),
            Some(Tok::Op(c)) => matches!(c, '(' | '[' | '{' | '⦃' | '|'),
            _ => false,
        }
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        let mut factors = vec![self.unary()?];
        loop {
            if self.eat_op('*') {
                factors.push(self.unary()?);
            } else if self.eat_op('/') {
                let d = self.unary()?;
                let n = Expr::product(std::mem::take(&mut factors));
                factors.push(Expr::Div(Box::new(n), Box::new(d)));
            } else if self.starts_primary() && !matches!(self.peek(), Some(Tok::Op('|'))) {
                factors.push(self.power()?);
            } else {
                break;
            }
        }
        Ok(Expr::product(factors))
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        if self.eat_op('-') {
            self.enter()?;
            let e = self.unary()?;
            self.depth -= 1;
            return Ok(Expr::Neg(Box::new(e)));
        }
        if self.eat_op('+') {
            return self.unary();
        }
        self.power()
    }

    /// Chained powers and postfix operators nest as brackets do, and count against the same
    /// depth limit (`5%%%…` would otherwise build a tree as deep as the answer is long).
    fn power(&mut self) -> Result<Expr, ParseError> {
        let depth = self.depth;
        let mut base = self.postfix_primary()?;
        while self.eat_op('^') {
            self.enter()?;
            let exp = self.group_or_atom()?;
            base = Expr::Pow(Box::new(base), Box::new(exp));
            base = self.postfix(base)?;
        }
        self.depth = depth;
        Ok(base)
    }

    fn postfix(&mut self, mut e: Expr) -> Result<Expr, ParseError> {
        let depth = self.depth;
        loop {
            if self.eat_op('%') {
                e = Expr::Percent(Box::new(e));
            } else if self.eat_op('!') {
                e = Expr::Func("fact".into(), vec![e]);
            } else {
                self.depth = depth;
                return Ok(e);
            }
            self.enter()?;
        }
    }

    fn postfix_primary(&mut self) -> Result<Expr, ParseError> {
        let p = self.primary()?;
        // subscripts name symbols: x_1, a_{37}
        let p = if self.peek() == Some(&Tok::Op('_')) {
            self.pos += 1;
            let sub = self.group_or_atom()?;
            match p {
                Expr::Sym(s) => Expr::Sym(format!("{s}_{}", sub.key())),
                other => Expr::Sym(format!("{}_{}", other.key(), sub.key())),
            }
        } else {
            p
        };
        self.postfix(p)
    }

    /// `{…}` group or a single token (exponents, subscripts, \frac12).
    fn group_or_atom(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let r = if self.eat_op('{') {
            let e = self.additive_or_list('}')?;
            if !self.eat_op('}') {
                return perr("missing }");
            }
            e
        } else {
            match self.next() {
                Some(Tok::Num(n)) => {
                    // \frac12: one digit per argument
                    let mut chars = n.chars();
                    let first = chars.next().expect("invariant: numbers are non-empty");
                    let rest: String = chars.collect();
                    if !rest.is_empty() && !n.contains('.') {
                        self.pos -= 1;
                        self.toks[self.pos] = Tok::Num(rest);
                        self.toks.insert(self.pos, Tok::Num(first.to_string()));
                        self.pos += 1;
                    }
                    number(&first.to_string())?
                }
                Some(t) => {
                    self.pos -= 1;
                    let _ = t;
                    self.primary()?
                }
                None => return perr("missing argument"),
            }
        };
        self.depth -= 1;
        Ok(r)
    }

    fn additive_or_list(&mut self, closer: char) -> Result<Expr, ParseError> {
        let mut items = self.list(&[closer])?;
        Ok(match items.len() {
            0 => return perr("empty group"),
            1 => items.pop().expect("invariant: one item"),
            _ => Expr::List(items),
        })
    }

    fn primary(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let tok = self
            .next()
            .ok_or_else(|| ParseError("unexpected end".into()))?;
        let e = match tok {
            Tok::Num(n) => number(&n)?,
            Tok::Ident(s) => {
                if s == "e" {
                    Expr::E
                } else if self.peek() == Some(&Tok::Op('(')) && "fghFGHPQWS".contains(s.as_str()) {
                    self.pos += 1;
                    let args = self.list(&[')'])?;
                    if !self.eat_op(')') {
                        return perr("missing )");
                    }
                    Expr::Func(s, args)
                } else {
                    Expr::Sym(s)
                }
            }
            Tok::Text(t) => Expr::Text(t),
            Tok::Env(env, body) => matrix(&env, &body)?,
            Tok::Op('(') | Tok::Op('[') => {
                let open = if tok == Tok::Op('(') { '(' } else { '[' };
                let items = self.list(&[')', ']'])?;
                let close = match self.next() {
                    Some(Tok::Op(c @ (')' | ']'))) => c,
                    _ => return perr("unclosed bracket"),
                };
                if items.len() == 1 && open == '(' && close == ')' {
                    items.into_iter().next().expect("invariant: one item")
                } else {
                    Expr::Seq { open, close, items }
                }
            }
            Tok::Op('{') => {
                let e = self.additive_or_list('}')?;
                if !self.eat_op('}') {
                    return perr("missing }");
                }
                match e {
                    Expr::List(items) => Expr::Set(items),
                    other => other,
                }
            }
            Tok::Op('⦃') => {
                let items = self.list(&['⦄'])?;
                if !self.eat_op('⦄') {
                    return perr("missing \\}");
                }
                Expr::Set(items)
            }
            Tok::Op('|') => {
                let inner = self.additive()?;
                if !self.eat_op('|') {
                    return perr("missing |");
                }
                Expr::Func("abs".into(), vec![inner])
            }
            Tok::Cmd(c) => self.command(&c)?,
            other => return perr(format!("unexpected {other:?}")),
        };
        self.depth -= 1;
        Ok(e)
    }

    fn command(&mut self, c: &str) -> Result<Expr, ParseError> {
        Ok(match c {
            "frac" | "over" => {
                let n = self.group_or_atom()?;
                let d = self.group_or_atom()?;
                Expr::Div(Box::new(n), Box::new(d))
            }
            "binom" => {
                let n = self.group_or_atom()?;
                let k = self.group_or_atom()?;
                Expr::Func("binom".into(), vec![n, k])
            }
            "sqrt" => {
                if self.eat_op('[') {
                    let idx = self.additive()?;
                    if !self.eat_op(']') {
                        return perr("missing ]");
                    }
                    let r = self.group_or_atom()?;
                    Expr::Func("root".into(), vec![idx, r])
                } else {
                    Expr::Func("sqrt".into(), vec![self.group_or_atom()?])
                }
            }
            "pi" => Expr::Pi,
            "infty" => Expr::Inf,
            "boxed" | "fbox" | "mathbb" | "mathcal" | "overline" | "hat" | "vec" | "bar"
            | "widehat" | "overrightarrow" => self.group_or_atom()?,
            f if FUNCS.contains(&f) => {
                let mut power = None;
                if self.eat_op('^') {
                    power = Some(self.group_or_atom()?);
                }
                let arg = if self.peek() == Some(&Tok::Op('(')) {
                    self.primary()?
                } else {
                    self.power()?
                };
                let call = Expr::Func(f.into(), vec![arg]);
                match power {
                    Some(p) => Expr::Pow(Box::new(call), Box::new(p)),
                    None => call,
                }
            }
            g if GREEK.contains(&g) => Expr::Sym(g.into()),
            "sum" | "prod" | "int" | "lim" => return perr(format!("\\{c} is not supported")),
            other => Expr::Sym(format!("\\{other}")),
        })
    }
}

fn matrix(env: &str, body: &str) -> Result<Expr, ParseError> {
    if !matches!(
        env,
        "pmatrix" | "bmatrix" | "matrix" | "vmatrix" | "array" | "smallmatrix"
    ) {
        return perr(format!("unsupported environment {env}"));
    }
    let mut rows = Vec::new();
    for row in body.split(['⏎']) {
        if row.trim().is_empty() {
            continue;
        }
        let mut cells = Vec::new();
        for cell in row.split('&') {
            cells.push(parse(cell)?);
        }
        rows.push(cells);
    }
    Ok(Expr::Matrix(rows))
}

fn number(s: &str) -> Result<Expr, ParseError> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = format!("{int}{frac}");
    let digits = if digits.is_empty() {
        "0".to_string()
    } else {
        digits
    };
    if digits.len() > 1000 {
        return perr("number too long");
    }
    let n: BigInt = digits
        .parse()
        .map_err(|_| ParseError(format!("bad number `{s}`")))?;
    let den = BigInt::from(10u32).pow(frac.len() as u32);
    Ok(Expr::Num {
        value: BigRational::new(n, den),
        places: s.contains('.').then_some(frac.len() as u32),
    })
}

/// Parses one answer (already extracted) into an expression.
pub fn parse(text: &str) -> Result<Expr, ParseError> {
    if text.len() > MAX_LEN {
        return perr(format!("answer longer than {MAX_LEN} bytes"));
    }
    let norm = normalize(text);
    if norm.is_empty() {
        return perr("empty answer");
    }
    // A plain word or phrase ("odd", "Evelyn", "regular hexagon") is text, not a product of letters.
    let letters = norm.chars().filter(|c| c.is_alphabetic()).count();
    if letters >= 2 && norm.chars().all(|c| c.is_alphabetic() || c == ' ') {
        return Ok(Expr::Text(norm));
    }
    let toks = tokenize(&norm)?;
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
    };
    let mut items = p.list(&[])?;
    if p.pos < p.toks.len() {
        return perr("trailing tokens");
    }
    // Units and words after a value ("125 miles", "\frac13 \text{meters}") are dropped.
    items = items.into_iter().map(strip_units).collect();
    Ok(match items.len() {
        0 => return perr("empty answer"),
        1 => items.pop().expect("invariant: one item"),
        _ => Expr::List(items),
    })
}

/// `v` when it is within [`MAX_EXACT_BITS`].
fn fits(v: BigRational) -> Option<BigRational> {
    (exact::bits(&v) <= MAX_EXACT_BITS).then_some(v)
}

fn strip_units(e: Expr) -> Expr {
    match e {
        Expr::Mul(fs)
            if fs.iter().any(|f| matches!(f, Expr::Text(_)))
                && fs.iter().any(|f| !matches!(f, Expr::Text(_))) =>
        {
            Expr::product(
                fs.into_iter()
                    .filter(|f| !matches!(f, Expr::Text(_)))
                    .collect(),
            )
        }
        Expr::Rel(items, ops) => Expr::Rel(items.into_iter().map(strip_units).collect(), ops),
        other => other,
    }
}

impl Expr {
    fn zero() -> Expr {
        Expr::Num {
            value: BigRational::zero(),
            places: None,
        }
    }

    fn sum(mut terms: Vec<Expr>) -> Expr {
        if terms.len() == 1 {
            terms.pop().expect("invariant: one term")
        } else {
            Expr::Add(terms)
        }
    }

    fn product(mut factors: Vec<Expr>) -> Expr {
        if factors.len() == 1 {
            factors.pop().expect("invariant: one factor")
        } else {
            Expr::Mul(factors)
        }
    }

    /// A short structural key (symbol names of subscripts, unknown-function hashing).
    pub fn key(&self) -> String {
        match self {
            Expr::Num { value, .. } => value.to_string(),
            Expr::Sym(s) => s.clone(),
            Expr::Text(t) => t.clone(),
            other => format!("{other:?}")
                .chars()
                .filter(|c| c.is_alphanumeric())
                .take(64)
                .collect(),
        }
    }

    /// Exact value when the expression is rational arithmetic on numbers; None beyond
    /// `MAX_EXACT_BITS` or when the work budget refuses an operation.
    pub fn exact(&self) -> Option<BigRational> {
        if !work::charge(1) {
            return None;
        }
        let v = match self {
            Expr::Num { value, .. } => value.clone(),
            Expr::Neg(a) => -a.exact()?,
            Expr::Add(ts) => ts.iter().try_fold(BigRational::zero(), |acc, t| {
                exact::add(&acc, &fits(t.exact()?)?)
            })?,
            Expr::Mul(fs) => fs.iter().try_fold(BigRational::one(), |acc, f| {
                fits(exact::mul(&acc, &fits(f.exact()?)?)?)
            })?,
            Expr::Div(a, b) => exact::div(&a.exact()?, &b.exact()?)?,
            Expr::Percent(a) => {
                exact::div(&a.exact()?, &BigRational::from_integer(BigInt::from(100)))?
            }
            Expr::Func(name, args) if name == "fact" && args.len() == 1 => {
                let n = args[0].exact()?;
                if !n.is_integer() {
                    return None;
                }
                exact::factorial(n.to_integer().to_u64()?)?
            }
            Expr::Pow(b, e) => {
                let base = b.exact()?;
                let exp = e.exact()?;
                if !exp.is_integer() {
                    return None;
                }
                let n = exp.to_integer().to_i64()?;
                let bits = (base.numer().bits().max(base.denom().bits()) + 1)
                    .saturating_mul(n.unsigned_abs());
                if bits > MAX_EXACT_BITS {
                    return None;
                }
                exact::pow(&base, n)?
            }
            _ => return None,
        };
        fits(v)
    }

    /// Numeric value with symbols bound by `env`; NaN when undefined.
    pub fn eval(&self, env: &dyn Fn(&str) -> f64) -> f64 {
        if !work::charge(1) {
            return f64::NAN;
        }
        match self {
            Expr::Num { value, .. } => value.to_f64().unwrap_or(f64::NAN),
            Expr::Sym(s) => env(s),
            Expr::Pi => std::f64::consts::PI,
            Expr::E => std::f64::consts::E,
            Expr::Inf => f64::INFINITY,
            Expr::Add(ts) => ts.iter().map(|t| t.eval(env)).sum(),
            Expr::Mul(fs) => fs.iter().map(|f| f.eval(env)).product(),
            Expr::Neg(a) => -a.eval(env),
            Expr::Div(a, b) => a.eval(env) / b.eval(env),
            Expr::Pow(b, e) => b.eval(env).powf(e.eval(env)),
            Expr::Percent(a) => a.eval(env) / 100.0,
            Expr::Func(name, args) => {
                let x = args.first().map_or(f64::NAN, |a| a.eval(env));
                match name.as_str() {
                    "sin" => x.sin(),
                    "cos" => x.cos(),
                    "tan" => x.tan(),
                    "sec" => 1.0 / x.cos(),
                    "csc" => 1.0 / x.sin(),
                    "cot" => 1.0 / x.tan(),
                    "arcsin" => x.asin(),
                    "arccos" => x.acos(),
                    "arctan" => x.atan(),
                    "sinh" => x.sinh(),
                    "cosh" => x.cosh(),
                    "tanh" => x.tanh(),
                    "ln" | "log" => x.ln(),
                    "lg" => x.log10(),
                    "exp" => x.exp(),
                    "sqrt" => x.sqrt(),
                    "abs" => x.abs(),
                    "root" => {
                        let r = args.get(1).map_or(f64::NAN, |a| a.eval(env));
                        if r < 0.0 && x.fract() == 0.0 && x % 2.0 == 1.0 {
                            -(-r).powf(1.0 / x)
                        } else {
                            r.powf(1.0 / x)
                        }
                    }
                    "fact" => gamma(x + 1.0),
                    "binom" => {
                        let k = args.get(1).map_or(f64::NAN, |a| a.eval(env));
                        gamma(x + 1.0) / (gamma(k + 1.0) * gamma(x - k + 1.0))
                    }
                    _ => {
                        // An unknown function f(x): a fixed smooth function keyed by its name.
                        let h = name
                            .bytes()
                            .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(b as u32))
                            % 97;
                        let s: f64 = args
                            .iter()
                            .enumerate()
                            .map(|(i, a)| a.eval(env) * (i as f64 + 1.3))
                            .sum();
                        (s + h as f64 * 0.37).sin() * 3.0 + s * 0.1
                    }
                }
            }
            _ => f64::NAN,
        }
    }

    /// Free symbols, sorted.
    pub fn symbols(&self, out: &mut Vec<String>) {
        match self {
            Expr::Sym(s) if !out.contains(s) => out.push(s.clone()),
            Expr::Sym(_) => {}
            Expr::Add(v)
            | Expr::Mul(v)
            | Expr::Func(_, v)
            | Expr::Set(v)
            | Expr::List(v)
            | Expr::Union(v) => v.iter().for_each(|e| e.symbols(out)),
            Expr::Seq { items, .. } | Expr::Rel(items, _) => {
                items.iter().for_each(|e| e.symbols(out))
            }
            Expr::Neg(a) | Expr::Percent(a) => a.symbols(out),
            Expr::Div(a, b) | Expr::Pow(a, b) | Expr::Pm(a, b) => {
                a.symbols(out);
                b.symbols(out)
            }
            Expr::Matrix(rows) => rows.iter().flatten().for_each(|e| e.symbols(out)),
            _ => {}
        }
    }

    /// Whether the expression mentions ∞ (so an infinite value is meant, not an overflow).
    pub fn has_infinity(&self) -> bool {
        match self {
            Expr::Inf => true,
            Expr::Add(v) | Expr::Mul(v) | Expr::Func(_, v) => v.iter().any(Expr::has_infinity),
            Expr::Neg(a) | Expr::Percent(a) => a.has_infinity(),
            Expr::Div(a, b) | Expr::Pow(a, b) => a.has_infinity() || b.has_infinity(),
            _ => false,
        }
    }
}

/// Γ(x) by the Lanczos approximation (g = 7), enough for factorials and binomials.
fn gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return std::f64::consts::PI / ((std::f64::consts::PI * x).sin() * gamma(1.0 - x));
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let a = C
        .iter()
        .enumerate()
        .skip(1)
        .fold(C[0], |acc, (i, c)| acc + c / (x + i as f64));
    (2.0 * std::f64::consts::PI).sqrt() * t.powf(x + 0.5) * (-t).exp() * a
}
