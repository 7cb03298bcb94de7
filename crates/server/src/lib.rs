//! Rein as a service.
pub mod assemble;
pub mod deployment;
pub mod service;
