//! The integration tests: one binary (see STYLE.md), one module per area.

mod archive;
mod cli;
mod eval;
mod manifest;
mod model;
mod objectives;
mod optim;
mod report;
mod train;
mod verify;
