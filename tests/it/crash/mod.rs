//! Crash tests of the real binaries: the control plane, the edge agent and
//! the trainer bridge run as processes and are SIGKILLed at seeded random
//! points, then started again on the same data; after each kill the
//! invariants hold:
//! - no acknowledged write is lost (a client-side ledger of every console
//!   write that got a 2xx, each read back);
//! - telemetry is stored exactly once (a device's acknowledged sequences,
//!   each stored once, and nothing else);
//! - no deployment is stuck: each one ends, and the fleet converges to the
//!   last one;
//! - every device serves a valid, signed version, old or new, never a
//!   broken one (each answer is checked against the version that gave it);
//! - a checkpoint upload cut by a kill at either end resumes, and the job
//!   completes with every checkpoint.
//!
//! The control plane's and the upload's tests run on the unreliable
//! artifact store (`EDGELOOP_FAULT_ARTIFACT_STORE`): delays, errors and
//! torn writes.
//! Each test prints its seed and a `crash summary:` line with its counts.

mod agent;
mod control_plane;
mod replicas;
mod site;
mod upload;
