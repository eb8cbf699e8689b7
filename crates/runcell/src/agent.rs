//! `runcell agent "QUESTION"`: the agent loop from the terminal, with the same upstream
//! settings as the server (`RUNCELL_AGENT_UPSTREAM`, `RUNCELL_AGENT_BASE_URL`,
//! `RUNCELL_AGENT_API_KEY`, `RUNCELL_AGENT_MODEL`). Each step is shown as it happens (the
//! code, its output, its verdict) on stderr, then the answer on stdout; `--json` prints the
//! final `chat.completion` object instead.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use runcell_agent::api::AgentPolicy;
use runcell_agent::conversation::{Conversation, Item};
use runcell_agent::{offered, Event, ServiceTools};
use runcell_core::{Caller, Engine, InputFile, Language, RunService};

pub struct AgentOptions {
    pub question: String,
    pub language: String,
    pub files: Vec<InputFile>,
    pub max_calls: Option<u32>,
    pub json: bool,
    /// The model API, from the settings (flags, environment, the file's `[agent]`).
    pub agent: Option<runcell_core::policy::AgentSettings>,
}

/// Exit status: 0 with an answer, 1 when the loop failed (the upstream, the budget), 2 for a
/// usage error.
pub fn agent(engine: Engine, o: AgentOptions) -> ExitCode {
    let usage = |m: String| {
        eprintln!("runcell agent: {m}");
        ExitCode::from(2)
    };
    let Some(settings) = o.agent.as_ref() else {
        return usage(
            "no model API configured: set RUNCELL_AGENT_UPSTREAM=anthropic|openai (or \
             --upstream), RUNCELL_AGENT_MODEL and RUNCELL_AGENT_API_KEY; for a local \
             OpenAI-compatible server, RUNCELL_AGENT_BASE_URL=http://host:port/v1"
                .into(),
        );
    };
    let Some(upstream) = runcell_agent::api::upstream_from_settings(settings) else {
        return usage(format!("unknown model API {:?}", settings.upstream));
    };
    let model = settings.model.clone();
    let Some(language) = Language::parse(&o.language) else {
        return usage(format!("unknown language '{}'", o.language));
    };
    let tool = format!("code_exec_{}", language.name());
    let catalog = runcell_mcp::Catalog::for_host(&engine);
    let (tools, unknown) = offered(&catalog, engine.config(), std::slice::from_ref(&tool));
    if !unknown.is_empty() {
        return usage(format!("{} is not available on this host", language.name()));
    }
    let policy = AgentPolicy::from_settings(settings);
    let mut bounds = policy.defaults.clone();
    if let Some(n) = o.max_calls {
        bounds.max_calls.insert(tool.clone(), n);
    }
    // The model's runs go through the run service as every door's: a model's source (it
    // writes code, files and a timeout; the operator's defaults size the sandbox), one
    // session per language, each run cut to what is left of the budget.
    let service = RunService::local(engine);
    let caller = Caller::local("agent");
    let ticket = match service.reserve(&caller) {
        Ok(t) => t,
        Err(e) => return usage(e.message),
    };
    let runner = ServiceTools::new(
        service,
        caller,
        ticket,
        o.files.clone(),
        std::time::Instant::now() + bounds.deadline,
    );
    let conv = Conversation {
        system: None,
        items: vec![Item::User(o.question.clone())],
    };
    let quiet = o.json;
    let show = move |e: Event| {
        if quiet {
            return;
        }
        match e {
            Event::ModelCall { n } => eprintln!("[model call {n}]"),
            Event::Text { text } => eprintln!("{text}"),
            Event::RunStarted { tool, code } => eprintln!("--- {tool} ---\n{}", code.trim_end()),
            Event::RunFinished { verdict, .. } => {
                if !verdict.stdout.is_empty() {
                    eprint!("--- stdout ---\n{}", verdict.stdout);
                }
                if !verdict.stderr.is_empty() {
                    eprint!("--- stderr ---\n{}", verdict.stderr);
                }
                match &verdict.error {
                    Some(err) => eprintln!("[{}] {}", err.category.as_str(), err.message),
                    None => eprintln!("[ok, {:.3} s]", verdict.execution_time),
                }
            }
            Event::Refused { tool, message } => eprintln!("[{tool} refused] {message}"),
        }
    };
    let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    else {
        return usage("cannot start the async runtime".into());
    };
    let result = rt.block_on(runcell_agent::run_agent(
        &upstream, &runner, &tools, conv, &bounds, &show,
    ));
    runner.close();
    match result {
        Ok(outcome) => {
            if o.json {
                let created = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let v = runcell_agent::api::completion("agent-cli", created, &model, &outcome);
                println!("{v}");
            } else {
                println!("{}", outcome.answer);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("runcell agent: {}: {}", e.category, e.message);
            ExitCode::from(1)
        }
    }
}
