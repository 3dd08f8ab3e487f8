//! Fronts: the confinement a front applies to itself before it reads untrusted input.
//! Fronts only ask; every decision is the monitor's.

pub mod confine;
pub mod delivery;
pub mod http;
pub mod mcp;
