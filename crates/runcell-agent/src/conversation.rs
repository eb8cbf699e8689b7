//! The conversation as the loop keeps it, independent of any upstream's wire format.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the tool's input (an object).
    pub input_schema: Value,
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The upstream's id for the call, echoed in its result.
    pub id: String,
    pub name: String,
    /// The arguments, as a JSON value (an object when the model behaves).
    pub arguments: Value,
}

/// One entry of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// The user's (or, for `system`, the operator's) text.
    User(String),
    /// A turn of the model: its text and the tools it called.
    Assistant {
        text: Option<String>,
        calls: Vec<ToolCall>,
    },
    /// The result of one tool call.
    ToolResult {
        call_id: String,
        content: String,
        is_error: bool,
    },
}

/// The system prompt and the items, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    pub system: Option<String>,
    pub items: Vec<Item>,
}

impl Conversation {
    /// About how many bytes the conversation holds (its texts, calls and results).
    pub fn approx_bytes(&self) -> usize {
        let items: usize = self
            .items
            .iter()
            .map(|i| match i {
                Item::User(t) => t.len(),
                Item::Assistant { text, calls } => {
                    text.as_ref().map_or(0, String::len)
                        + calls
                            .iter()
                            .map(|c| c.id.len() + c.name.len() + c.arguments.to_string().len())
                            .sum::<usize>()
                }
                Item::ToolResult {
                    call_id, content, ..
                } => call_id.len() + content.len(),
            })
            .sum();
        items + self.system.as_ref().map_or(0, String::len)
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// It answered.
    EndTurn,
    /// It called tools.
    ToolUse,
    /// It ran out of output tokens.
    MaxTokens,
    /// Something else the upstream said (kept verbatim).
    Other(String),
}

/// Tokens a model call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// The counts are the upstream's numbers (any u64), so they saturate rather than overflow.
impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
    }

    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// What one model call answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub text: Option<String>,
    pub calls: Vec<ToolCall>,
    pub stop: StopReason,
    pub usage: Usage,
    /// The model that answered, as the upstream named it.
    pub model: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: token counts are the upstream's numbers (any u64); adding them overflowed,
    /// a panic in a debug build and a count that wraps to near zero in a release one.
    #[test]
    fn token_counts_from_the_upstream_saturate() {
        let huge = Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: u64::MAX,
        };
        assert_eq!(huge.total(), u64::MAX);
        let mut sum = Usage::default();
        sum.add(huge);
        sum.add(huge);
        assert_eq!(sum, huge);
    }
}
