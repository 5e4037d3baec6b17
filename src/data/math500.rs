//! MATH-500 (Lightman et al., "Let's Verify Step by Step"): 500 problems of MATH.
//! The prepared file is byte-identical to the hub's `HuggingFaceH4/MATH-500` `test.jsonl`.

use super::{DatasetSpec, HubCopy};

pub const SPEC: DatasetSpec = DatasetSpec {
    name: "math500",
    heading: "MATH500",
    file: "math500.jsonl",
    rows: 500,
    version: "1",
    sha256: "dbd9978c21ff78fcd08f7ea38013fa25cd692bbd3ce3f1c558ee279296a5aac2",
    hub: Some(HubCopy::Jsonl {
        repo: "HuggingFaceH4/MATH-500",
        file: "test.jsonl",
        id_field: "unique_id",
        problem_field: "problem",
        answer_field: "answer",
    }),
};
