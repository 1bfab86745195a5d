//! The chronoshard binary's end-to-end tests, as one test binary: each file is a module, and
//! `common` holds what they share (platforms, clusters of separate processes, hand-driven
//! workers). One binary links the workspace once instead of once per file; `scripts/test.sh`
//! runs its tests side by side with cargo-nextest, each in a process of its own.

mod common;

mod alerts;
mod api_contract;
mod api_fuzz;
mod backpressure;
mod binary;
mod client_verbs;
mod client_workflows;
mod clock_offset;
mod dashboards;
mod deploy_examples;
mod drain;
mod engine;
mod failover;
mod fire_ahead;
mod generated_client;
mod grow;
mod grow_dev;
mod grow_time_window;
mod horizon;
mod job_ids;
mod limits;
mod local_calls;
mod lost_tickets;
mod metrics;
mod nats_restart;
mod overlap;
mod plugins;
mod policies;
mod postgres;
mod production_cluster;
mod python_worker;
mod queue_signals;
mod restart;
mod result_pull;
mod role_config;
mod settings;
mod shard_node_process;
mod sigstop;
mod time_window;
mod tokens;
mod traces;
mod walking_skeleton;
mod watchdog;
mod worker_process;
mod worker_sdk;
mod workflow_faults;
mod workflows;
