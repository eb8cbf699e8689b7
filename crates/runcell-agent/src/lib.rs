//! runcell-agent: the loop around the sandbox. A model is given the `code_exec_*` tools (the
//! MCP server's descriptions and schemas), the code it writes runs in runcell, the trimmed
//! verdict goes back to it as the tool's result (an error in the upstream's own format when
//! the run failed), and the loop stops at the model's answer or at one of its bounds. Written
//! once, for `POST /v1/agents` and `runcell agent`.
//!
//! * [`conversation`]: the neutral conversation the loop keeps;
//! * [`openai`] and [`anthropic`]: the two wire formats (Chat Completions, Messages);
//! * [`run`]: the loop and its bounds.
#![forbid(unsafe_code)]

pub mod anthropic;
pub mod api;
pub mod conversation;
pub mod openai;
pub mod run;
pub mod tools;
pub mod upstream;

pub use conversation::{Conversation, Item, StopReason, ToolCall, ToolSpec, Turn, Usage};
pub use run::{
    run_agent, step_verdict, AgentError, Bounds, Event, Model, ModelError, Outcome, Step, Tools,
    STEP_OUTPUT_BYTES,
};
pub use tools::{offered, ServiceTools};
pub use upstream::{Upstream, Wire};
