//! Fronts: the confinement a front applies to itself before it reads untrusted input,
//! and the HTTP front. Fronts only ask; every decision is the monitor's.

pub mod confine;
