//! The layer in front of a real axum server on loopback, driven by a real HTTP client:
//! decisions and headers (`edge`), the Prometheus endpoint (`metrics_endpoint`), the
//! decision records reaching `tracing` (`tracing_records`). One test binary, so that the
//! server, the client and the layer's generic code are compiled once.

mod connect_info;
mod edge;
mod key_limit;
mod metrics_endpoint;
mod observability;
mod remote;
mod safe_defaults;
mod support;
mod tracing_records;
