//! Request bodies parsed into the fixed-shape `proto` structs the supervisor takes: no JSON
//! or TOML text a caller sent travels past the front. Each parser is strict (no unknown
//! key, no duplicate key, no wrong type) and gives the answer a caller can act on; the
//! supervisor checks every value it receives again, and judges what needs the caller's
//! rights (deploy, private addresses) and the ceilings.

pub mod layer;
pub mod limits;
pub mod run;
