//! Minerva Math (OCWCourses, 272 problems); answers are the boxed part of each solution, as the
//! Qwen2.5-Math evaluation harness extracts them. No faithful hub copy.

use super::DatasetSpec;

pub const SPEC: DatasetSpec = DatasetSpec {
    name: "minerva",
    heading: "MINERVA",
    file: "minerva_math.jsonl",
    rows: 272,
    version: "1",
    sha256: "06088dca1443898b03f7134cb8849536afb4b19bdf767f7f9be81a92f51a6ee3",
    hub: None,
};
