//! runcell-core: the shared vocabulary (request, limits policy, verdict) and the engine that
//! the CLI, the HTTP API and the MCP server all call.
#![forbid(unsafe_code)]

pub mod engine;
pub mod files;
pub mod limits;
pub mod request;
pub mod stream;
pub mod units;
pub mod verdict;

pub use engine::{Engine, EngineConfig};
pub use limits::{LimitOverrides, Limits, Policy};
pub use request::{ExecRequest, InputFile};
pub use verdict::{ErrorCategory, Verdict, VerdictError};
