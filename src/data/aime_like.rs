//! AIME-like (Reinforce-Ada): 230 problems from AIME24, AIME25, HMMT24, HMMT25, BRUMO25, AMC23
//! and CMIMC25, assembled with the paper's composition (the original HF set could not be read).

use super::DatasetSpec;

pub const SPEC: DatasetSpec = DatasetSpec {
    name: "aime-like",
    heading: "AIME-like",
    file: "aime_like.jsonl",
    rows: 230,
    version: "1",
    sha256: "dc2b20ee0287bd1a965dff346de3d6614557d6d593a4977f365d73b751dd37d0",
    hub: None,
};
