//! runcell-mcp: runcell as a Model Context Protocol server, with the official Rust SDK
//! (rmcp).
//!
//! * [`catalog`]: the tools, one `code_exec_<language>` per runtime installed on this host,
//!   described from the real runtime versions, packages and limits; input and output schemas
//!   from `schemars`.
//! * [`server`]: the `ServerHandler`: `tools/list`, `tools/call`, live output as progress
//!   notifications, cancellation that kills the sandbox.
//! * [`result`]: a verdict as a tool result (text, images, files, `structuredContent`,
//!   `isError`).
//! * [`context`]: who calls (over HTTP, what the server's middleware found out) and how a
//!   refusal of the run service reads. Calls run through runcell's one run service.
//! * [`transport`]: stdio and the Streamable HTTP tower service.
//! * [`formats`]: the same tools as Anthropic and OpenAI tool definitions.
#![forbid(unsafe_code)]

pub mod catalog;
pub mod context;
pub mod formats;
pub mod progress;
pub mod result;
pub mod server;
pub mod transport;

pub use catalog::{arguments, Catalog, RuntimeInfo, ToolDef};
pub use context::{caller, Rejection, StreamClosed};
pub use formats::{render, Format};
pub use server::McpServer;
pub use tokio_util::sync::CancellationToken;
pub use transport::{
    http_service, serve_stdio, HttpEndpoint, HttpOptions, HttpService, McpError, TOO_MANY_SESSIONS,
};
