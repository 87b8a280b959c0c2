// Drives cryo's sandbox gateway (E2B_SANDBOX_URL) with the official SDK
// (npm e2b), asking envd only its GET /health (Sandbox.isRunning), which
// needs no token. One step per run:
//   node e2b_gateway.mjs STEP "" [SANDBOX_IDS_JSON]
// It prints one JSON line and exits 1 on a failed expectation, naming it.
import { createRequire } from 'node:module'
import { join } from 'node:path'

const require = createRequire(join(process.env.E2B_SDK_DIR, 'node_modules', 'x.js'))
const { Sandbox } = require('e2b')

const [step, , idsJSON] = process.argv.slice(2)
const ids = idsJSON ? JSON.parse(idsJSON) : {}
const long = { requestTimeoutMs: 300_000 }

function expect(ok, what) {
  if (!ok) throw new Error('expectation failed: ' + what)
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// handle is the SDK's sandbox object for an id, as Sandbox.connect builds
// it, without connecting (which would resume a paused sandbox).
const handle = (sandboxId) => new Sandbox({ sandboxId, envdVersion: '0.5.7' })

const steps = {
  // Two sandboxes that pause on timeout, one with autoResume.
  async create() {
    const opts = { timeoutMs: 1_800_000, metadata: { run: process.env.RUN }, ...long }
    const auto = await Sandbox.create('base', { ...opts, lifecycle: { onTimeout: 'pause', autoResume: true } })
    const plain = await Sandbox.create('base', { ...opts, lifecycle: { onTimeout: 'pause' } })
    expect((await auto.getInfo()).lifecycle?.autoResume === true, 'getInfo reports autoResume')
    expect((await plain.getInfo()).lifecycle?.autoResume === false, 'getInfo reports no autoResume')
    return { auto: auto.sandboxId, plain: plain.sandboxId }
  },
  // Running: the gateway reaches each one's port 49983; an unknown id is
  // not running (E2B's 502). Then both time out (and pause).
  async running() {
    for (const id of [ids.auto, ids.plain]) expect((await handle(id).isRunning(long)) === true, `isRunning of running ${id}`)
    expect((await handle('nosuchsandbox').isRunning()) === false, 'isRunning of an unknown id')
    for (const id of [ids.auto, ids.plain]) await Sandbox.setTimeout(id, 1_000)
    return ids
  },
  async paused() {
    const deadline = Date.now() + 300_000
    for (const id of [ids.auto, ids.plain]) {
      while ((await Sandbox.getInfo(id)).state !== 'paused') {
        expect(Date.now() < deadline, `${id} paused 5 minutes after its timeout`)
        await sleep(1000)
      }
    }
    // Without autoResume: not running, and it stays paused.
    expect((await handle(ids.plain).isRunning()) === false, 'isRunning of a paused sandbox without autoResume')
    expect((await Sandbox.getInfo(ids.plain)).state === 'paused', 'the gateway left the sandbox without autoResume paused')
    // With autoResume: the request resumes it, and the restored envd
    // answers it.
    const t0 = performance.now()
    expect((await handle(ids.auto).isRunning(long)) === true, 'isRunning of a paused sandbox with autoResume')
    const ms = performance.now() - t0
    expect((await Sandbox.getInfo(ids.auto)).state === 'running', 'state after the gateway resumed it')
    return { ...ids, resumeMs: ms }
  },
}

try {
  console.log(JSON.stringify(await steps[step]()))
  process.exit(0)
} catch (e) {
  console.error(`${step}: ${e.stack || e}`)
  process.exit(1)
}
