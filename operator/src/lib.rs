//! microvirt's operator: kube-rs controllers mapping the `microvirt.io` CRDs onto virt-launcher pods.

pub mod config;
pub mod controller;
pub mod health;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod pod;
pub mod pool;
pub mod selector;
pub mod shutdown;
pub mod vm;
pub mod vmi;
pub mod vmirs;
