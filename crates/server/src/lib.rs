//! Rein as a service.
pub mod deployment;
