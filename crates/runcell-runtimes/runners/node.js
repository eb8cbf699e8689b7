// runcell's session interpreter for JavaScript (Node): runs a session's cells one after another
// in one global context, like the Node REPL: top-level `let`, `const`, `class` and function
// declarations, and globals, persist from cell to cell (declaring the same `let`/`const` name
// again is the SyntaxError it is in the REPL). `require` resolves from /workspace. The value
// of a final expression is displayed (a promise is awaited first). `process.exit(n)` ends the
// cell, not the session, with exit code n. SIGINT (a timeout) interrupts the running cell.
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
}

let count = 0;

async function runCell(path) {
  count += 1;
  let code = 0;
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
    if (value !== undefined) process.stdout.write(util.inspect(value) + '\n');
  } catch (e) {
    if (e instanceof CellExit) {
      code = e.code;
    } else {
      printError(e);
      const interrupted =
        (e && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') || e instanceof CellInterrupted;
      code = interrupted ? 130 : 1;
    }
  } finally {
    interruptWaiting = null;
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
