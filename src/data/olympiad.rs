//! OlympiadBench OE_TO_maths_en_COMP, the 675-row version the paper's weights match (the hub's
//! cleaned copy has 674 rows and rewritten relay problems, so it is not used).

use super::DatasetSpec;

pub const SPEC: DatasetSpec = DatasetSpec {
    name: "olympiadbench",
    heading: "OLYMPIAD",
    file: "olympiadbench.jsonl",
    rows: 675,
    version: "1",
    sha256: "b22cafd934c56fa6faa92d42fa08a4e602ea00be0fe81dbf067a3bfa1518ff9c",
    hub: None,
};
