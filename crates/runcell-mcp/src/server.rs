//! The MCP server: `tools/list` serves the catalog, `tools/call` runs the program through the
//! executor, streams its output as progress notifications when the client asked for them,
//! and kills the sandbox as soon as the call is cancelled.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ElicitRequest, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationSchema, Implementation, InputRequest, InputRequiredResult,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use runcell_core::{Call, RunError, RunService, RunSummary, Source, Target};

use crate::catalog::Catalog;
use crate::context::{caller, Rejection};
use crate::progress;
use crate::result;

/// How long clients may cache the tool list. It changes only when the operator installs a
/// runtime and restarts the server.
const TOOLS_TTL_MS: u64 = 5 * 60 * 1000;

/// runcell as an MCP server. Cheap to clone: the Streamable HTTP transport makes one per
/// session.
#[derive(Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

struct Inner {
    service: RunService,
    catalog: Arc<Catalog>,
    /// `mcp-stdio` or `mcp-http`.
    interface: &'static str,
}

impl McpServer {
    /// Tools from `catalog`, run through `service` (whose admission, audit and metrics
    /// apply to every call, as for any other door).
    pub fn new(service: RunService, catalog: Arc<Catalog>, interface: &'static str) -> McpServer {
        McpServer {
            inner: Arc::new(Inner {
                service,
                catalog,
                interface,
            }),
        }
    }

    pub fn catalog(&self) -> &Catalog {
        &self.inner.catalog
    }

    /// Run one call to completion or until `ctx.ct` says it was cancelled. Everything but an
    /// unknown tool is a tool result (or, for a call that needs its user's approval on a
    /// 2026-07-28 client, the input request that asks for it).
    async fn call(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let catalog = &self.inner.catalog;
        let Some(def) = catalog.get(&request.name) else {
            let known: Vec<&str> = catalog.tools().iter().map(|t| t.name.as_str()).collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "Unknown tool '{}'. This server has: {}.",
                    request.name,
                    known.join(", ")
                ),
                None,
            ));
        };
        let language = def.language.name();
        let input_responses = request.input_responses;
        let mut arguments = request.arguments;
        let http = ctx.extensions.get::<http::request::Parts>().cloned();
        let caller = caller(http.as_ref(), self.inner.interface);
        let service = &self.inner.service;
        let refuse = |e: RunError| {
            service.refused(&caller, &RunSummary::of_language(language), &e);
            e
        };
        let invalid = |message: String| {
            refuse(RunError::invalid(message.clone()));
            Ok(result::invalid_request(language, message).into())
        };
        let target = match crate::catalog::session_target(&mut arguments) {
            Ok(t) => t.unwrap_or(Target::OneShot),
            Err(message) => return invalid(message),
        };
        let req = match catalog.request(def, arguments, target.kind()) {
            Ok(req) => req,
            Err(message) => return invalid(message),
        };
        // Network approval by the client's user (where the operator chose so): asked before
        // anything runs; otherwise the run service waits for the operator's approval.
        let asked: Vec<String> = req.network.iter().flat_map(|n| n.allow.clone()).collect();
        let mut approved = false;
        if let (Some(within), false) = (catalog.approval(), asked.is_empty()) {
            match approve(&ctx, language, &asked, within, input_responses.as_ref()).await {
                Approval::Granted => approved = true,
                Approval::Ask(input) => return Ok(CallToolResponse::InputRequired(input)),
                Approval::Refused(message) => {
                    refuse(RunError::new(
                        runcell_core::ErrorKind::ApprovalDenied,
                        message.clone(),
                    ));
                    return Ok(result::approval_refused(language, message).into());
                }
            }
        }
        // Over HTTP: the stream that would carry the result; once the client has closed it,
        // the call is cancelled.
        let closed = http
            .as_ref()
            .and_then(|p| p.extensions.get::<crate::context::StreamClosed>())
            .cloned()
            .unwrap_or_default()
            .0;
        let hold = http
            .as_ref()
            .and_then(|p| p.extensions.get::<runcell_core::Hold>())
            .cloned();
        let (sink, rx) = progress::channel();
        let token = ctx.meta.get_progress_token();
        let mut call = Call::new(caller.clone(), Source::Mcp, target, req);
        call.approved = approved;
        // A session another server holds (named here, in the arguments, where the HTTP
        // router cannot see it): that server carries the call out.
        let elsewhere = service.elsewhere(&call);
        // rmcp runs tool calls in its own tasks: the span carries the HTTP request's id into
        // the run, as for `POST /v1/execute`.
        let span = tracing::info_span!("mcp_call", id = %caller.request_id);
        let run = tracing::Instrument::instrument(
            async {
                let ticket = service.reserve(&caller)?;
                // The result travels in the response of the HTTP request that carried the
                // call: the place in line is kept until it is delivered.
                if let Some(hold) = &hold {
                    hold.keep(&ticket);
                }
                if let Some(pod) = &elsewhere {
                    let _held = ticket;
                    return service.run_elsewhere(pod, call, Box::new(sink)).await;
                }
                let admitted = service.admit(ticket, call).await?;
                admitted.run(Box::new(sink)).await
            },
            span,
        );
        // The output goes to the client while the program runs, and all of it before the
        // result. Without a progress token it is only drained: the verdict has it anyway.
        let work = async {
            let forward = async {
                match token {
                    Some(token) => progress::forward(rx, ctx.peer.clone(), token).await,
                    None => {
                        let mut rx = rx;
                        while rx.recv().await.is_some() {}
                    }
                }
            };
            let (verdict, ()) = tokio::join!(run, forward);
            verdict
        };
        tokio::select! {
            // Dropping `work` drops the run's future, which kills the sandbox at once.
            _ = ctx.ct.cancelled() => Ok(result::cancelled_result().into()),
            _ = closed.cancelled() => Ok(result::cancelled_result().into()),
            verdict = work => Ok(match verdict {
                Ok(v) => result::verdict_result(&v),
                Err(e) => result::rejection_result(language, &Rejection::from(e)),
            }.into()),
        }
    }
}

/// The key of the approval in a 2026-07-28 client's input responses.
const APPROVAL_INPUT: &str = "runcell_network_approval";

enum Approval {
    Granted,
    /// Ask the user: a 2026-07-28 client retries the call with the answer.
    Ask(InputRequiredResult),
    Refused(String),
}

/// Ask the client's user whether code that asks for `asked` may run: by an elicitation
/// request on clients before 2026-07-28, by an input request (retried with the answer) from
/// then on. Declined, cancelled, unanswered or unaskable: refused, with what happened.
async fn approve(
    ctx: &RequestContext<RoleServer>,
    language: &str,
    asked: &[String],
    within: std::time::Duration,
    responses: Option<&rmcp::model::InputResponses>,
) -> Approval {
    let dests = asked.join(", ");
    let message = format!(
        "Allow this {language} code to connect to {dests}? runcell's proxy lets it reach only \
         these destinations; the code runs only if you accept."
    );
    let schema = ElicitationSchema::builder()
        .optional_bool("approve", true)
        .description("Accept to let the code run with this network access.")
        .build_unchecked();
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    };
    let modern = ctx
        .protocol_version()
        .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
    let answer: Result<ElicitResult, String> = if modern {
        match responses.and_then(|r| r.get(APPROVAL_INPUT)) {
            None => {
                let mut input = rmcp::model::InputRequests::new();
                input.insert(
                    APPROVAL_INPUT.to_string(),
                    InputRequest::Elicitation(ElicitRequest::new(params)),
                );
                return Approval::Ask(InputRequiredResult::from_input_requests(input));
            }
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| format!("the client's answer is not an elicitation result ({e})")),
        }
    } else {
        let supported = ctx.peer.supported_elicitation_modes();
        if supported.is_empty() {
            return Approval::Refused(format!(
                "This server runs code with network access ({dests}) only when the user \
                 approves it, and this MCP client cannot ask its user (it does not support \
                 elicitation). Nothing ran. Run the code without `network`, or use a client \
                 that supports elicitation."
            ));
        }
        ctx.peer
            .create_elicitation_with_timeout(params, Some(within))
            .await
            .map_err(|e| format!("the approval could not be asked ({e})"))
    };
    match answer {
        Ok(r) if r.action == ElicitationAction::Accept => {
            let approved = r
                .content
                .as_ref()
                .and_then(|c| c.get("approve"))
                .and_then(|a| a.as_bool())
                .unwrap_or(true);
            if approved {
                Approval::Granted
            } else {
                Approval::Refused(format!(
                    "The user did not approve network access ({dests}); nothing ran."
                ))
            }
        }
        Ok(r) => Approval::Refused(format!(
            "The user {} network access ({dests}); nothing ran. Do not retry with the same \
             destinations unless the user asks you to.",
            if r.action == ElicitationAction::Decline {
                "declined"
            } else {
                "dismissed the request for"
            }
        )),
        Err(why) => Approval::Refused(format!(
            "Network access ({dests}) needs the user's approval, and {why}; nothing ran."
        )),
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let names: Vec<&str> = self
            .inner
            .catalog
            .tools()
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("runcell", env!("CARGO_PKG_VERSION"))
                    .with_title("runcell")
                    .with_description("Runs code in isolated, network-less sandboxes."),
            )
            .with_instructions(format!(
                "runcell runs programs in isolated Linux sandboxes without network access, one \
                 tool per language ({}). Each call is independent: a fresh sandbox that is \
                 thrown away afterwards. Results carry stdout, stderr, the exit code, plots as \
                 images and the files written to /workspace; a failed run is an error result \
                 whose category says what went wrong.",
                names.join(", ")
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(
            ListToolsResult::with_all_items(self.inner.catalog.mcp_tools())
                .with_ttl_ms(TOOLS_TTL_MS),
        )
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        let catalog = &self.inner.catalog;
        catalog.get(name).map(|def| catalog.mcp_tool(def))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.call(request, context).await
    }
}
