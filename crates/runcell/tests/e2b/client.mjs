// Drives runcell's E2B door with the official JS SDK (@e2b/code-interpreter, installed by
// scripts/test.sh into target/e2b-js) and prints what it saw as one JSON object; the
// assertions are in crates/runcell/tests/e2b.rs. Environment as for client.py.
import { createRequire } from 'node:module'
const require = createRequire(process.argv[2] + '/')
const { Sandbox } = require('@e2b/code-interpreter')

const report = {}
async function step(name, fn) {
  try {
    report[name] = await fn()
  } catch (e) {
    report[name] = { raised: e?.constructor?.name ?? String(e), message: String(e?.message ?? e).slice(0, 300) }
  }
}
const ex = (e) => ({
  text: e.text ?? null,
  stdout: e.logs.stdout.join(''),
  stderr: e.logs.stderr.join(''),
  results: e.results.map((r) => ({ text: r.text ?? null, html: r.html ?? null, png: !!r.png, main: r.isMainResult })),
  error: e.error ? { name: e.error.name, value: e.error.value, traceback: e.error.traceback } : null,
})

const a = await Sandbox.create({ envs: { FOO: 'bar' }, metadata: { suite: 'e2b-js' } })
const b = await Sandbox.create()
report.ids = [a.sandboxId, b.sandboxId]
await step('state_set', async () => ex(await a.runCode('x = 41')))
await step('last_value', async () => ex(await a.runCode('x + 1')))
await step('isolated', async () => ex(await b.runCode('x')))
await step('exception', async () => ex(await a.runCode('def f():\n    return 1/0\nf()')))
await step('logs', async () => ex(await a.runCode("import sys\nprint('to out')\nprint('to err', file=sys.stderr)")))
await step('env', async () => ex(await a.runCode("import os\nprint(os.environ['FOO'], os.environ.get('PER'))", { envs: { PER: 'run' } })))
await step('files', async () => {
  await a.files.write('/home/user/a.txt', 'hello file')
  await a.files.write('/home/user/b.bin', new Uint8Array([0, 1, 254, 255]).buffer)
  const read = ex(await a.runCode("print(open('a.txt').read(), list(open('b.bin', 'rb').read()))")).stdout
  await a.runCode("open('c.bin', 'wb').write(bytes([0, 128, 255]))")
  const bytes = Array.from(await a.files.read('/home/user/c.bin', { format: 'bytes' }))
  const list = (await a.files.list('/home/user')).map((e) => e.name).sort()
  return { read, bytes, list, text: await a.files.read('/home/user/a.txt') }
})
await step('commands', async () => {
  const r = await a.commands.run('echo hi $FOO; echo oops >&2')
  let exit
  try {
    await a.commands.run('exit 3')
    exit = 'no error'
  } catch (e) {
    exit = e.exitCode
  }
  return { stdout: r.stdout, stderr: r.stderr, exit }
})
await step('info', async () => {
  const i = await a.getInfo()
  return { id: i.sandboxId, template: i.templateId, metadata: i.metadata, state: i.state }
})
await step('timeout', async () => {
  await a.setTimeout(120_000)
  return { seconds_left: ((await a.getInfo()).endAt.getTime() - Date.now()) / 1000 }
})
await step('list', async () => (await Sandbox.list().nextItems()).map((s) => s.sandboxId).sort())
await step('connect', async () => {
  const c = await Sandbox.connect(a.sandboxId)
  return { x: ex(await c.runCode('print(x)')).stdout }
})
await step('other_key', async () => {
  let connect
  try {
    await Sandbox.connect(a.sandboxId, { apiKey: process.env.OTHER_KEY })
    connect = 'connected'
  } catch (e) {
    connect = e.constructor.name
  }
  return { connect, kill: await Sandbox.kill(a.sandboxId, { apiKey: process.env.OTHER_KEY }) }
})
await step('wrong_key', async () => {
  try {
    await Sandbox.create({ apiKey: process.env.WRONG_KEY })
    return 'created'
  } catch (e) {
    return e.constructor.name
  }
})
await step('kill', async () => ({ a: await a.kill().then(() => true), b: await Sandbox.kill(b.sandboxId), again: await Sandbox.kill(a.sandboxId) }))
console.log(JSON.stringify(report))
