// runcell's session interpreter for JavaScript (Node): runs a session's cells one after another
// in one global context, like the Node REPL: top-level `let`, `const`, `class` and function
// declarations, and globals, persist from cell to cell (declaring the same `let`/`const` name
// again is the SyntaxError it is in the REPL). `require` resolves from /workspace. The value
// of a final expression is displayed (a promise is awaited first). `process.exit(n)` ends the
// cell, not the session, with exit code n. SIGINT (a timeout) interrupts the running cell.
// The final value is also reported as the cell's main result (`text/plain`, util.inspect), and
// an uncaught error as its exception, in /tmp/.runcell-results.json, which the host reads
// after the cell (docs/results.md). A call's own environment variables are in
// /tmp/.runcell-env (NAME=value entries, each ended by NUL): set for that cell, then undone.
//
// Channel (fd 4, a unix socket to the sandbox's pid 1): "R\n" when ready; pid 1 sends
// "K <source path>\n"; this process answers "D <exit code>\n" when the cell is over.
'use strict';
const fs = require('fs');
const net = require('net');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');

class CellInterrupted {}

class CellExit {
  constructor(code) {
    this.code = code;
  }
}

globalThis.require = createRequire('/workspace/<cell>');
process.exit = (code) => {
  throw new CellExit(code === undefined ? (process.exitCode ?? 0) : Number(code) | 0);
};

// An error thrown later by a callback of an earlier cell is reported, not fatal: the session
// goes on (a notebook does the same).
process.on('uncaughtException', (e) => {
  if (!(e instanceof CellExit)) printError(e);
});
process.on('unhandledRejection', (e) => {
  if (!(e instanceof CellExit)) printError(e);
});

let interruptWaiting = null;
// Outside a cell's synchronous run, SIGINT ends the wait for its promise (if any); it never
// ends the session.
process.on('SIGINT', () => {
  if (interruptWaiting) interruptWaiting();
});

const RESULTS_PATH = '/tmp/.runcell-results.json';
const ENV_PATH = '/tmp/.runcell-env';
// The most bytes of results a cell reports (the host's cap is the same): past it, results
// are left out and counted.
const RESULTS_MAX_BYTES = 8 << 20;

function unlinkQuietly(path) {
  try {
    fs.unlinkSync(path);
  } catch {
    // (Not there.)
  }
}

// The call's own variables, if any (the file is removed).
function takeEnv() {
  let data;
  try {
    const c = fs.constants;
    const fd = fs.openSync(ENV_PATH, c.O_RDONLY | c.O_NOFOLLOW | c.O_NONBLOCK);
    try {
      const buf = Buffer.alloc(1 << 20);
      data = buf.subarray(0, fs.readSync(fd, buf, 0, buf.length, 0)).toString('utf8');
    } finally {
      fs.closeSync(fd);
    }
  } catch {
    return [];
  } finally {
    unlinkQuietly(ENV_PATH);
  }
  const pairs = [];
  for (const entry of data.split('\0')) {
    const i = entry.indexOf('=');
    if (i > 0) pairs.push([entry.slice(0, i), entry.slice(i + 1)]);
  }
  return pairs;
}

function applyEnv(pairs) {
  const restore = [];
  for (const [name, value] of pairs) {
    restore.push([name, Object.prototype.hasOwnProperty.call(process.env, name) ? process.env[name] : undefined]);
    process.env[name] = value;
  }
  return restore;
}

function restoreEnv(restore) {
  for (const [name, old] of restore.reverse()) {
    if (old === undefined) delete process.env[name];
    else process.env[name] = old;
  }
}

// The cell's report, written whole under a temporary name first.
function writeResults(report) {
  let data = Buffer.from(JSON.stringify(report), 'utf8');
  if (data.length > RESULTS_MAX_BYTES) {
    report.results = [];
    report.dropped = 1;
    data = Buffer.from(JSON.stringify(report), 'utf8');
  }
  const tmp = RESULTS_PATH + '.tmp';
  unlinkQuietly(tmp);
  const c = fs.constants;
  const fd = fs.openSync(tmp, c.O_WRONLY | c.O_CREAT | c.O_EXCL | c.O_NOFOLLOW, 0o600);
  try {
    fs.writeSync(fd, data);
  } finally {
    fs.closeSync(fd);
  }
  fs.renameSync(tmp, RESULTS_PATH);
}

function exceptionOf(e, text) {
  let name = 'Error';
  let value = '';
  try {
    if (e instanceof CellInterrupted) {
      name = 'Interrupted';
    } else if (e !== null && typeof e === 'object') {
      name = String(e.name ?? e.constructor?.name ?? 'Error');
      value = String(e.message ?? '');
    } else {
      name = 'Uncaught';
      value = util.inspect(e);
    }
  } catch {
    // (A hostile getter: the names stay the defaults.)
  }
  return { name, value, traceback: text };
}

function printError(e) {
  let text;
  if (e instanceof CellInterrupted) {
    text = 'Interrupted (SIGINT) while the cell\'s promise was pending';
  } else if (e instanceof Error && typeof e.stack === 'string') {
    text = e.stack
      .split('\n')
      .filter((l) => !/^\s+at (.*[( ])?(\[eval\]|node:)/.test(l))
      .join('\n');
  } else {
    text = 'Uncaught ' + util.inspect(e);
  }
  process.stderr.write(text + '\n');
  return text;
}

let count = 0;

async function runCell(path) {
  count += 1;
  let code = 0;
  const report = { results: [], exception: null };
  unlinkQuietly(RESULTS_PATH);
  const restore = applyEnv(takeEnv());
  try {
    const source = fs.readFileSync(path, 'utf8');
    fs.unlinkSync(path);
    const script = new vm.Script(source, { filename: `<cell ${count}>` });
    let value = script.runInThisContext({ breakOnSigint: true, displayErrors: true });
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
      value = await Promise.race([
        value,
        new Promise((_, reject) => {
          interruptWaiting = () => reject(new CellInterrupted());
        }),
      ]);
    }
    if (value !== undefined) {
      const shown = util.inspect(value);
      process.stdout.write(shown + '\n');
      report.results.push({ is_main_result: true, data: { 'text/plain': shown } });
    }
  } catch (e) {
    if (e instanceof CellExit) {
      code = e.code;
    } else {
      report.exception = exceptionOf(e, printError(e));
      const interrupted =
        (e && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') || e instanceof CellInterrupted;
      code = interrupted ? 130 : 1;
    }
  } finally {
    interruptWaiting = null;
    restoreEnv(restore);
  }
  try {
    writeResults(report);
  } catch (e) {
    process.stderr.write(`runcell: the cell's results could not be reported: ${e}\n`);
  }
  return code & 0xff;
}

const chan = new net.Socket({ fd: 4, readable: true, writable: true });
let pending = '';
let queue = Promise.resolve();
chan.on('data', (chunk) => {
  pending += chunk.toString('utf8');
  let i;
  while ((i = pending.indexOf('\n')) >= 0) {
    const line = pending.slice(0, i);
    pending = pending.slice(i + 1);
    if (!line.startsWith('K ')) process.reallyExit(125);
    queue = queue.then(async () => {
      const code = await runCell(line.slice(2));
      chan.write(`D ${code}\n`);
    });
  }
});
chan.on('end', () => process.reallyExit(0));
chan.on('error', () => process.reallyExit(125));
chan.write('R\n');
