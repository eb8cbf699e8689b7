"""Drive runcell's /v1/agents with the official openai Python client, as existing client code
would: base_url at runcell's /v1/agents, runcell's API key as the client's key, the code
tools in `tools`. The answers are parsed by the client's own types (ChatCompletion,
ChatCompletionChunk); runcell's `runcell` extension is an extra field of them.

Usage: openai_client.py BASE_URL API_KEY (the scripted upstream answers 42 twice: once for
the completion, once for the stream). Prints "completion ok" and "stream ok".
"""

import sys

import openai

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=90)
tools = [{"type": "runcell_tool", "name": "code_exec_python", "runtime_params": {"max_calls": 3}}]

# A wrong key is refused with the client's own error type.
try:
    openai.OpenAI(base_url=base_url, api_key="wrong-key", max_retries=0).chat.completions.create(
        model="scripted-model", messages=[{"role": "user", "content": "q"}], tools=tools)
    sys.exit("a wrong key was accepted")
except openai.AuthenticationError:
    pass

completion = client.chat.completions.create(
    model="scripted-model",
    messages=[{"role": "system", "content": "Use the tools."},
              {"role": "user", "content": "What is 6 times 7?"}],
    tools=tools,
    temperature=0,
)
assert isinstance(completion, openai.types.chat.ChatCompletion), type(completion)
assert completion.object == "chat.completion", completion
assert completion.choices[0].message.content == "42", completion
assert completion.choices[0].finish_reason == "stop", completion
assert completion.usage.total_tokens == 26, completion.usage
extension = completion.model_extra["runcell"]
assert extension["code_attempts"] == 1, extension
assert extension["steps"][0]["verdict"]["stdout"] == "42\n", extension
print("completion ok")

stream = client.chat.completions.create(
    model="scripted-model",
    messages=[{"role": "user", "content": "What is 6 times 7, step by step?"}],
    tools=tools,
    stream=True,
    stream_options={"include_usage": True},
)
text, events, last = "", [], None
for chunk in stream:
    assert isinstance(chunk, openai.types.chat.ChatCompletionChunk), type(chunk)
    assert chunk.object == "chat.completion.chunk"
    for choice in chunk.choices:
        text += choice.delta.content or ""
    extra = (chunk.model_extra or {}).get("runcell")
    if extra and "type" in extra:
        events.append(extra["type"])
    last = chunk
assert text == "It is 42.", text
kinds = set(events)
assert {"model_call", "text", "run_started", "run_finished"} <= kinds, events
assert events.index("run_started") < events.index("run_finished"), events
assert last.choices[0].finish_reason == "stop", last
assert last.usage is not None and last.usage.total_tokens == 26, last
print("stream ok")
