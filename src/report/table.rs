//! Markdown tables, the one way every report writes them (Table 1, the seeds' verdict, the
//! sweeps, the PMD check, the benchmarks, the plans): a header row, an alignment row (`---` for
//! text, `---:` for numbers), then a line per row, each cell as given. An empty cell is written
//! as one space (`| |`), as a hand-written table would have it.

use std::fmt;

/// How a column is aligned: text to the left, numbers to the right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A Markdown table being filled row by row; [`fmt::Display`] writes it, ending in a newline.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table of these columns (heading, alignment), no rows yet.
    pub fn new<S: Into<String>>(columns: impl IntoIterator<Item = (S, Align)>) -> Table {
        let (header, align) = columns.into_iter().map(|(h, a)| (h.into(), a)).unzip();
        Table {
            header,
            align,
            rows: Vec::new(),
        }
    }

    /// Adds a row; it has one cell per column.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Table {
        let cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        assert_eq!(
            cells.len(),
            self.header.len(),
            "invariant: a row has one cell per column"
        );
        self.rows.push(cells);
        self
    }

    /// The rows added so far.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// `| a | b |`: each cell between single spaces, an empty one as one space.
fn line(f: &mut fmt::Formatter<'_>, cells: &[String]) -> fmt::Result {
    f.write_str("|")?;
    for c in cells {
        if c.is_empty() {
            f.write_str(" |")?;
        } else {
            write!(f, " {c} |")?;
        }
    }
    f.write_str("\n")
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        line(f, &self.header)?;
        f.write_str("|")?;
        for a in &self.align {
            f.write_str(match a {
                Align::Left => "---|",
                Align::Right => "---:|",
            })?;
        }
        f.write_str("\n")?;
        for row in &self.rows {
            line(f, row)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_written_as_markdown_with_its_alignments() {
        let mut t = Table::new([("model", Align::Left), ("tokens", Align::Right)]);
        assert!(t.is_empty());
        t.row(["qwen3", "1,024"]).row(["", "7"]);
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.to_string(),
            "| model | tokens |\n|---|---:|\n| qwen3 | 1,024 |\n| | 7 |\n"
        );
    }

    #[test]
    #[should_panic(expected = "one cell per column")]
    fn a_row_of_the_wrong_width_is_a_bug() {
        Table::new([("a", Align::Left)]).row(["1", "2"]);
    }
}
