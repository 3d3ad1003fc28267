//! The integration tests: real processes and servers on loopback, one
//! module per area, all in this one test binary, so that the workspace
//! links it once rather than once per file. The harness they share is the
//! `edgeloop-tests` library (`tests/src/`).
//!
//! One area: `cargo test -p edgeloop-tests --test it rollout::`; one test:
//! `... --test it -- --exact rollout::<name>`. The tests run side by side on
//! the test threads of one process, so a test that changes what the process
//! shares (its environment, its peak memory) runs in a process of its own
//! (`edgeloop_tests::in_own_process`). A test that needs a service it does
//! not find (PostgreSQL, S3, Chromium) skips through
//! `edgeloop_tests::skip_or_fail!`, which fails it instead under
//! `EDGELOOP_REQUIRE_SERVICES=1`, as `scripts/test.sh` runs the suite.
#![allow(clippy::unwrap_used)]

mod access;
mod artifacts;
mod big_model_loop;
mod cli;
mod console;
mod crash;
mod crash_pipeline;
mod demo;
mod device_benchmark;
mod download_limits;
mod drift;
mod edge_agent;
mod enrollment;
mod failover;
mod helm_chart;
mod jobs;
mod kubernetes_fake_api;
mod labelling;
mod local_gpus;
mod model_push;
mod model_sync;
mod model_zoo;
mod openapi_conformance;
mod packages;
mod pytorch;
mod renewal;
mod replica_wakeup;
mod rest_api;
mod restart;
mod retention;
mod retrain;
mod rollout;
mod s3_artifacts;
mod supply_chain;
mod telemetry;
mod training;
mod training_containers;
mod training_engines;
mod training_gpus;
mod training_kubernetes;
mod trigger_reads;
mod variants;
