//! One function per command of `acpo` (`cli::run` dispatches to them).

pub mod archive;
pub mod bench;
pub mod check;
pub mod doc;
pub mod eval;
pub mod export;
pub mod generate;
pub mod import;
pub mod model;
pub mod pipeline;
pub mod pmd;
pub mod report;
pub mod reproduce;
pub mod score;
pub mod sweep;
pub mod train;
