// Drives a cryo sandbox end to end with the official SDK (npm e2b):
// the control-plane API (E2B_API_URL) and envd through cryo's gateway
// (E2B_SANDBOX_URL), configured only through those two and E2B_API_KEY,
// one step per run:
//   node e2b_sandbox.mjs STEP [SANDBOX_ID] [STATE_JSON]
// It prints one JSON line (the step's findings, which the next steps get
// back as STATE_JSON) and exits 1 on a failed expectation, naming it.
// integration/e2b_sandbox_test.go runs the steps and checks the cluster
// between them.
import { createRequire } from 'node:module'
import { join } from 'node:path'

// The SDK is installed in a cache directory, not next to this script.
const require = createRequire(join(process.env.E2B_SDK_DIR, 'node_modules', 'x.js'))
const { Sandbox, CommandExitError, SandboxNotFoundError, NotFoundError, AuthenticationError, FilesystemEventType } = require('e2b')

const [step, id, stateJSON] = process.argv.slice(2)
const state = stateJSON ? JSON.parse(stateJSON) : {}
// QEMU under TCG is slow: a pause or a resume may take minutes.
const long = { requestTimeoutMs: 300_000 }
const HOME = '/home/user'
const STATE = `agent state ${process.env.RUN}: ${'x'.repeat(64)}`
// The background process: a counter, one step a second, on stdout and in
// a file.
const COUNTER = `i=0; while :; do i=$((i+1)); echo $i; echo $i > ${HOME}/counter; sleep 1; done`

function expect(ok, what) {
  if (!ok) throw new Error('expectation failed: ' + what)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function until(what, ms, fn) {
  const deadline = Date.now() + ms
  for (;;) {
    const v = await fn()
    if (v) return v
    if (Date.now() > deadline) throw new Error(`expectation failed: ${what} within ${ms / 1000} s`)
    await sleep(250)
  }
}

async function listed(query) {
  const out = []
  const p = Sandbox.list({ query })
  while (p.hasNext) for (const s of await p.nextItems()) out.push(s)
  return out
}

async function refused(fn, check, what) {
  try {
    await fn()
  } catch (e) {
    expect(check(e), `${what}: ${e.name}: ${e.message}`)
    return e
  }
  throw new Error(`${what}: no error`)
}

const notFound = (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError

// waitPaused polls getInfo until the sandbox is paused (an autoPause).
async function waitPaused(sid) {
  return until(`sandbox ${sid} paused`, 240_000, async () => (await Sandbox.getInfo(sid)).state === 'paused')
}

// counterAfter attaches to the background counter and returns the first
// value it prints above `above`.
async function counterAfter(sbx, pid, above) {
  let seen = 0
  const h = await sbx.commands.connect(pid, {
    onStdout: (d) => {
      for (const n of d.split('\n').map(Number)) if (n > seen) seen = n
    },
    timeoutMs: 0,
  })
  await until(`counter (pid ${pid}) above ${above}`, 30_000, () => seen > above)
  await h.disconnect()
  return seen
}

const steps = {
  // Create from the template, then the sandbox side: commands (stdout,
  // stderr, exit code, stdin, a PTY, a background process) and files
  // (write, read, list, watch).
  async create() {
    const sbx = await Sandbox.create('base', { timeoutMs: 1_800_000, metadata: { suite: 'e2b-sandbox', run: process.env.RUN }, envs: { GREETING: 'hi' }, ...long })

    const r = await sbx.commands.run('echo "$GREETING from $(cat /etc/hostname 2>/dev/null || hostname)"; echo oops >&2')
    expect(r.exitCode === 0 && r.stdout.startsWith('hi from') && r.stderr === 'oops\n', `commands.run: ${JSON.stringify(r)}`)
    const exit = await refused(() => sbx.commands.run('echo partial; echo bad >&2; exit 3'), (e) => e instanceof CommandExitError, 'a failing command')
    expect(exit.exitCode === 3 && exit.stdout === 'partial\n' && exit.stderr === 'bad\n', `CommandExitError: exit ${exit.exitCode} stdout ${JSON.stringify(exit.stdout)} stderr ${JSON.stringify(exit.stderr)}`)

    // What E2B's envd gives every process: code checks it to tell it runs
    // in a sandbox, and which.
    const env = await sbx.commands.run('echo "$E2B_SANDBOX $E2B_SANDBOX_ID $E2B_TEMPLATE_ID"')
    expect(env.stdout === `true ${sbx.sandboxId} base\n`, `E2B_SANDBOX, E2B_SANDBOX_ID, E2B_TEMPLATE_ID: ${JSON.stringify(env.stdout)}`)
    // A background command that ended before its client came back: connect
    // still gets its exit, as from E2B's envd, which keeps ends for 30 s.
    const quick = await sbx.commands.run('echo done; exit 4', { background: true })
    await quick.disconnect()
    await until('the quick command to end', 30_000, async () => !(await sbx.commands.list()).some((p) => p.pid === quick.pid))
    const late = await sbx.commands.connect(quick.pid)
    const ended = await refused(() => late.wait(), (e) => e instanceof CommandExitError, 'connect to a command that ended')
    expect(ended.exitCode === 4, `exit code through a late connect: ${ended.exitCode}`)

    const cat = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(cat.pid, 'hello ')
    await sbx.commands.sendStdin(cat.pid, 'stdin\n')
    await sbx.commands.closeStdin(cat.pid)
    const catted = await cat.wait()
    expect(catted.stdout === 'hello stdin\n', `stdin echoed back as ${JSON.stringify(catted.stdout)}`)

    let tty = ''
    const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { tty += Buffer.from(d).toString() }, timeoutMs: 60_000 })
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo pty-$((6*7))\n'))
    await until('the PTY to print pty-42', 30_000, () => tty.includes('pty-42'))
    expect(tty.includes('24 80'), `stty size in the PTY: ${JSON.stringify(tty)}`)
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('exit\n'))
    await pty.wait().catch(() => {})

    await sbx.files.makeDir(`${HOME}/watched`)
    const events = []
    const watch = await sbx.files.watchDir(`${HOME}/watched`, (e) => events.push(e), { timeoutMs: 0 })
    const info = await sbx.files.write(`${HOME}/state.txt`, STATE)
    expect(info.path === `${HOME}/state.txt`, `files.write answered ${JSON.stringify(info)}`)
    await sbx.files.write(`${HOME}/watched/seen.txt`, 'watch me')
    expect((await sbx.files.read(`${HOME}/state.txt`)) === STATE, 'files.read returns what was written')
    const names = (await sbx.files.list(HOME)).map((e) => e.name)
    expect(names.includes('state.txt') && names.includes('watched'), `files.list ${HOME}: ${names}`)
    await until('a watchDir event for seen.txt', 30_000, () => events.some((e) => e.name === 'seen.txt' && (e.type === FilesystemEventType.WRITE || e.type === FilesystemEventType.CREATE)))
    await watch.stop()

    const bg = await sbx.commands.run(COUNTER, { background: true })
    const started = await counterAfter(sbx, bg.pid, 2)
    const last = Number((await sbx.files.read(`${HOME}/counter`)).trim())
    expect(last >= started, `counter file ${last} behind its output ${started}`)
    await bg.disconnect()
    return { id: sbx.sandboxId, pid: bg.pid, counter: last }
  },

  async pause() {
    expect((await Sandbox.pause(id, long)) === true, 'pause returns true')
    const info = await Sandbox.getInfo(id)
    expect(info.state === 'paused', `state ${info.state}, want paused`)
    const paused = await listed({ state: ['paused'], metadata: { run: process.env.RUN } })
    expect(paused.some((s) => s.sandboxId === id), `paused list ${JSON.stringify(paused.map((s) => s.sandboxId))} lacks ${id}`)
    return { ...state }
  },

  // Connect: the same files, and the background process still counting,
  // its counter past where the pause left it.
  async connect() {
    const sbx = await Sandbox.connect(id, { timeoutMs: 1_800_000, ...long })
    expect((await sbx.files.read(`${HOME}/state.txt`)) === STATE, 'state.txt after connect')
    const procs = await sbx.commands.list()
    expect(procs.some((p) => p.pid === state.pid), `commands.list after connect: ${JSON.stringify(procs.map((p) => p.pid))}, want pid ${state.pid}`)
    const counter = await counterAfter(sbx, state.pid, state.counter)
    expect(counter > state.counter, `counter ${counter} after connect, was ${state.counter}`)
    return { ...state, counter }
  },

  // A snapshot, and a new sandbox created from it with the same files and
  // processes; the source runs on.
  async snapshot() {
    const sbx = await Sandbox.connect(id, long)
    const snap = await sbx.createSnapshot(long)
    expect(typeof snap.snapshotId === 'string' && snap.snapshotId !== '', `createSnapshot answered ${JSON.stringify(snap)}`)
    expect((await sbx.getInfo()).state === 'running', 'the source runs after createSnapshot')
    const copy = await Sandbox.create(snap.snapshotId, { timeoutMs: 600_000, ...long })
    expect(copy.sandboxId !== id, 'a sandbox from the snapshot has its own id')
    expect((await copy.files.read(`${HOME}/state.txt`)) === STATE, 'state.txt in the sandbox from the snapshot')
    const procs = await copy.commands.list()
    expect(procs.some((p) => p.pid === state.pid), `the counter runs in the sandbox from the snapshot: ${JSON.stringify(procs.map((p) => p.pid))}`)
    expect((await copy.kill()) === true, 'kill the sandbox from the snapshot')
    return { ...state, snapshotId: snap.snapshotId, copy: copy.sandboxId }
  },

  // fork: two sandboxes with the source's files, each then its own.
  async fork() {
    const forks = await Sandbox.fork(id, { count: 2, timeoutMs: 600_000, ...long })
    expect(forks.length === 2, `fork answered ${forks.length} entries`)
    for (const f of forks) expect(f instanceof Sandbox, `a fork failed: ${f}`)
    const [a, b] = forks
    expect(a.sandboxId !== b.sandboxId && a.sandboxId !== id, 'forks have their own ids')
    for (const f of forks) expect((await f.files.read(`${HOME}/state.txt`)) === STATE, `state.txt in fork ${f.sandboxId}`)
    await a.files.write(`${HOME}/mine.txt`, 'a')
    await refused(() => b.files.read(`${HOME}/mine.txt`), (e) => e instanceof NotFoundError || /not found|no such/i.test(e.message), "fork b reading fork a's file")
    const src = await Sandbox.connect(id, long)
    expect((await src.getInfo()).state === 'running', 'the source runs after fork')
    for (const f of forks) expect((await f.kill()) === true, `kill fork ${f.sandboxId}`)
    return { ...state, forks: forks.map((f) => f.sandboxId) }
  },

  async list() {
    const running = await listed({ state: ['running'], metadata: { run: process.env.RUN } })
    expect(running.some((s) => s.sandboxId === id), `running list ${JSON.stringify(running.map((s) => s.sandboxId))} lacks ${id}`)
    const paused = await listed({ state: ['paused'], metadata: { run: process.env.RUN } })
    expect(!paused.some((s) => s.sandboxId === id), `paused list has the running ${id}`)
    return { ...state }
  },

  // autoPause (onTimeout 'pause') without autoResume: paused after its
  // timeout, not running for envd (the gateway's 502), back with connect.
  // The timeout runs from the create's request, as on E2B, and a cold boot
  // takes 10-20 s under the other lanes' load: 30 s leaves the write
  // before the pause room.
  async autopause() {
    const sbx = await Sandbox.create('base', { timeoutMs: 30_000, lifecycle: { onTimeout: 'pause', autoResume: false }, metadata: { run: process.env.RUN }, ...long })
    await sbx.files.write(`${HOME}/auto.txt`, 'before the timeout')
    await waitPaused(sbx.sandboxId)
    expect((await sbx.isRunning()) === false, 'isRunning of an auto-paused sandbox without autoResume')
    const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000, ...long })
    expect((await back.files.read(`${HOME}/auto.txt`)) === 'before the timeout', 'auto.txt after connect')
    expect((await back.kill()) === true, 'kill the auto-paused sandbox')
    return { id: sbx.sandboxId }
  },

  // autoResume: the first envd call through the gateway resumes it.
  async autoresume() {
    const sbx = await Sandbox.create('base', { timeoutMs: 30_000, lifecycle: { onTimeout: 'pause', autoResume: true }, metadata: { run: process.env.RUN }, ...long })
    const info = await sbx.getInfo()
    expect(info.lifecycle?.autoResume === true, `lifecycle ${JSON.stringify(info.lifecycle)}`)
    await sbx.files.write(`${HOME}/auto.txt`, 'resumed by traffic')
    await waitPaused(sbx.sandboxId)
    expect((await sbx.files.read(`${HOME}/auto.txt`)) === 'resumed by traffic', 'auto.txt read through the gateway')
    expect((await Sandbox.getInfo(sbx.sandboxId)).state === 'running', 'state after the gateway resumed it')
    return { id: sbx.sandboxId }
  },

  // A short timeout for the autoresume sandbox, whose VM the test kills
  // next: it prints the end the reaper removes it at. Long enough for the
  // kill, the kubelet's notice and the checks of an ended sandbox before
  // it under load.
  async timeout() {
    await Sandbox.setTimeout(id, 120_000)
    return { endAt: (await Sandbox.getInfo(id)).endAt }
  },

  // The sandbox's VM died (the test killed it): it is gone, as on E2B,
  // although it was paused once and has autoResume: not found, not
  // listed, not running for envd, and not resumed by the gateway from the
  // pause before it died.
  async ended() {
    await refused(() => Sandbox.getInfo(id), notFound, 'getInfo of an ended sandbox')
    await refused(() => Sandbox.setTimeout(id, 60_000), notFound, 'setTimeout of an ended sandbox')
    await refused(() => Sandbox.connect(id, long), notFound, 'connect to an ended sandbox')
    const all = await listed({ metadata: { run: process.env.RUN } })
    expect(!all.some((s) => s.sandboxId === id), `list has the ended ${id} as ${JSON.stringify(all.filter((s) => s.sandboxId === id))}`)
    const t0 = Date.now()
    const gone = new Sandbox({ sandboxId: id, envdVersion: '0.5.7' })
    expect((await gone.isRunning()) === false, 'isRunning of an ended sandbox')
    expect(Date.now() - t0 < 10_000, `isRunning of an ended sandbox took ${Date.now() - t0} ms: the gateway tried to resume it`)
    return {}
  },

  async refusals() {
    await refused(() => Sandbox.getInfo('nosuchsandbox'), notFound, 'getInfo of an unknown id')
    await refused(() => Sandbox.connect('nosuchsandbox'), notFound, 'connect to an unknown id')
    // The gateway: an unknown sandbox is not running (E2B's 502).
    const ghost = new Sandbox({ sandboxId: 'nosuchsandbox', envdVersion: '0.5.7', envdAccessToken: 'x' })
    expect((await ghost.isRunning()) === false, 'isRunning of an unknown sandbox through the gateway')
    // envd's token: the right sandbox with a wrong token is refused.
    const forged = new Sandbox({ sandboxId: id, envdVersion: '0.5.7', envdAccessToken: 'not-the-token' })
    await refused(() => forged.files.read(`${HOME}/state.txt`), (e) => e instanceof AuthenticationError, 'envd with a wrong access token')
    await refused(() => Sandbox.list({ apiKey: 'bad-key' }).nextItems(), (e) => e instanceof AuthenticationError, 'a bad key')
    const other = { apiKey: process.env.OTHER_KEY }
    await refused(() => Sandbox.getInfo(id, other), notFound, "another namespace's key: getInfo")
    await refused(() => Sandbox.connect(id, other), notFound, "another namespace's key: connect")
    expect((await Sandbox.kill(id, other)) === false, "another namespace's key: kill returns false")
    return {}
  },

  // The benchmark's steps (BenchmarkE2BPauseResume): each prints how
  // long its SDK calls took, in ms, measured here (not node's start).
  async 'bench-create'() {
    const sbx = await Sandbox.create('base', { timeoutMs: 86_400_000, metadata: { run: process.env.RUN }, ...long })
    await sbx.files.write(`${HOME}/state.txt`, STATE)
    await sbx.commands.run(COUNTER, { background: true })
    return { id: sbx.sandboxId }
  },
  async 'bench-pause'() {
    const t0 = performance.now()
    expect((await Sandbox.pause(id, long)) === true, 'pause returns true')
    return { ms: performance.now() - t0 }
  },
  // Resume: connect of the paused sandbox to the first command's output.
  async 'bench-resume'() {
    const t0 = performance.now()
    const sbx = await Sandbox.connect(id, { timeoutMs: 86_400_000, ...long })
    const r = await sbx.commands.run(`cat ${HOME}/counter`)
    const ms = performance.now() - t0
    expect(Number(r.stdout.trim()) > 0, `the counter after resume: ${JSON.stringify(r.stdout)}`)
    return { ms, counter: Number(r.stdout.trim()) }
  },

  async kill() {
    expect((await Sandbox.kill(id)) === true, 'kill returns true')
    await refused(() => Sandbox.getInfo(id), notFound, 'getInfo after kill')
    const gone = new Sandbox({ sandboxId: id, envdVersion: '0.5.7' })
    expect((await gone.isRunning()) === false, 'isRunning after kill')
    return {}
  },
}

try {
  const out = await steps[step]()
  console.log(JSON.stringify(out))
  // Streams the SDK keeps open (a disconnected handle's socket) must not
  // keep the step alive.
  process.exit(0)
} catch (e) {
  console.error(`${step}: ${e.stack || e}`)
  process.exit(1)
}
