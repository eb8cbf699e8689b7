// Drives runcell's MCP server with the official TypeScript SDK (crates/runcell/tests/mcp.rs
// copies this file next to the pinned SDK in target/ts-mcp and runs it):
//   node ts_client.mjs stdio /path/to/runcell
//   node ts_client.mjs http http://127.0.0.1:PORT/mcp KEY
// Lists the tools, makes a call that succeeds and one that fails, closes, and prints a JSON
// report. Anything the SDK warns about (its output-schema validation among others) is
// collected, and any warning makes the exit status 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
const warnings = [];
for (const k of ["warn", "error"]) {
  const orig = console[k];
  console[k] = (...a) => { warnings.push(a.map(String).join(" ")); orig(...a); };
}
const [mode, target, key] = process.argv.slice(2);
const client = new Client({ name: "runcell-test", version: "1.0.0" });
const transport = mode === "stdio"
  ? new StdioClientTransport({ command: target, args: ["mcp"], stderr: "inherit" })
  : new StreamableHTTPClientTransport(new URL(target), key ? { requestInit: { headers: { Authorization: `Bearer ${key}` } } } : undefined);
await client.connect(transport);
const { tools } = await client.listTools();
const res = await client.callTool({ name: "code_exec_bash", arguments: { code: "echo hi" } });
const bad = await client.callTool({ name: "code_exec_bash", arguments: { code: "exit 3" } });
await client.close();
const out = { tools: tools.map(t => t.name), stdout: res.structuredContent?.stdout, isError: res.isError, badError: bad.isError, warnings };
console.log(JSON.stringify(out));
process.exit(warnings.length ? 1 : 0);
