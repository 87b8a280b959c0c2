// Drives cryo's E2B API with the official SDK (npm e2b), configured only
// through E2B_API_URL and E2B_API_KEY, one step per run:
//   node e2b_control_plane.mjs STEP [SANDBOX_ID [ARG]]
// It prints one JSON line (the step's findings) and exits 1 on a failed
// expectation, naming it. integration/e2b_test.go runs the steps and checks
// the cluster between them.
import { createRequire } from 'node:module'
import { join } from 'node:path'

// The SDK is installed in a cache directory, not next to this script.
const require = createRequire(join(process.env.E2B_SDK_DIR, 'node_modules', 'x.js'))
const { Sandbox, SandboxNotFoundError, AuthenticationError, NotFoundError, Template, Volume } = require('e2b')

const [step, id, arg] = process.argv.slice(2)
const long = { requestTimeoutMs: 300_000 }

function expect(ok, what) {
  if (!ok) throw new Error('expectation failed: ' + what)
}

async function ids(query) {
  const out = []
  const p = Sandbox.list({ query })
  while (p.hasNext) for (const s of await p.nextItems()) out.push(s)
  return out
}

async function all(paginator) {
  const out = []
  while (paginator.hasNext) for (const s of await paginator.nextItems()) out.push(s)
  return out
}

async function refused(fn, what, re) {
  try {
    await fn()
  } catch (e) {
    expect(re.test(e.message), `${what}: refused with ${e.name}: ${e.message}, want ${re}`)
    return
  }
  throw new Error(`${what}: accepted, want refused with ${re}`)
}

async function notFound(fn, what) {
  try {
    await fn()
  } catch (e) {
    expect(e instanceof SandboxNotFoundError || e instanceof NotFoundError, `${what}: ${e.name}: ${e.message}, want not found`)
    return
  }
  throw new Error(`${what}: no error, want not found`)
}

const steps = {
  async create() {
    const sbx = await Sandbox.create('base', { timeoutMs: 600_000, metadata: { suite: 'e2b', run: process.env.RUN }, envs: { GREETING: 'hi' }, ...long })
    expect(/^[0-9a-f]{64}$/.test(sbx.envdAccessToken ?? ''), `envdAccessToken ${sbx.envdAccessToken}`)
    const info = await sbx.getInfo()
    expect(info.sandboxId === sbx.sandboxId, 'getInfo names the sandbox')
    expect(info.state === 'running', `state ${info.state}, want running`)
    expect(info.templateId === 'base', `template ${info.templateId}`)
    expect(info.metadata.suite === 'e2b', `metadata ${JSON.stringify(info.metadata)}`)
    return { id: sbx.sandboxId, endAt: info.endAt, token: sbx.envdAccessToken }
  },
  // createSnapshot of the running sandbox (it runs on), listed by sandbox
  // and by name, and a new sandbox created from it.
  async snapshot() {
    const sbx = await Sandbox.connect(id, long)
    const snap = await sbx.createSnapshot({ name: 'it-snap', ...long })
    expect(snap.snapshotId && snap.names.includes('it-snap'), `createSnapshot answered ${JSON.stringify(snap)}`)
    expect((await Sandbox.getInfo(id)).state === 'running', 'the sandbox runs on after createSnapshot')
    const mine = await all(sbx.listSnapshots())
    expect(mine.length === 1 && mine[0].snapshotId === snap.snapshotId, `listSnapshots of the sandbox: ${JSON.stringify(mine)}`)
    const named = await all(Sandbox.listSnapshots({ name: 'it-snap' }))
    expect(named.length === 1, `listSnapshots by name: ${JSON.stringify(named)}`)
    const paged = Sandbox.listSnapshots({ limit: 1 })
    expect((await paged.nextItems()).length === 1, 'a page of one snapshot')
    expect((await all(Sandbox.listSnapshots({ apiKey: process.env.OTHER_KEY }))).length === 0, "another namespace's key lists no snapshot")
    const copy = await Sandbox.create(snap.snapshotId, { timeoutMs: 600_000, ...long })
    expect(copy.sandboxId !== id, 'a new sandbox id')
    expect(copy.envdAccessToken === sbx.envdAccessToken, "the copy has its source's envd token")
    const info = await copy.getInfo()
    expect(info.state === 'running' && info.templateId === snap.snapshotId, `the copy: ${JSON.stringify(info)}`)
    return { snapshotId: snap.snapshotId, copyId: copy.sandboxId }
  },
  // Delete the snapshot of step snapshot (id) once its copy (arg) is gone.
  async dropsnapshot() {
    expect((await Sandbox.kill(arg)) === true, 'kill of the copy')
    expect((await Sandbox.deleteSnapshot(id)) === true, 'deleteSnapshot returns true')
    expect((await Sandbox.deleteSnapshot(id)) === false, 'a second deleteSnapshot returns false')
    return {}
  },
  async fork() {
    const forks = await Sandbox.fork(id, { count: 2, timeoutMs: 600_000, ...long })
    expect(forks.length === 2, `fork answered ${forks.length} entries`)
    for (const f of forks) expect(f instanceof Sandbox, `a fork failed: ${f}`)
    expect(forks[0].sandboxId !== forks[1].sandboxId && !forks.some((f) => f.sandboxId === id), 'new sandbox ids')
    expect((await Sandbox.getInfo(id)).state === 'running', 'the source runs on after fork')
    return { ids: forks.map((f) => f.sandboxId) }
  },
  async metrics() {
    const ms = await Sandbox.getMetrics(id)
    expect(ms.length === 1, `getMetrics answered ${JSON.stringify(ms)}`)
    const m = ms[0]
    expect(m.cpuCount >= 1 && m.timestamp instanceof Date && !isNaN(m.timestamp), `metric ${JSON.stringify(m)}`)
    expect(typeof m.memUsed === 'number' && typeof m.diskUsed === 'number', `metric ${JSON.stringify(m)}`)
    return m
  },
  async running() {
    const running = await ids({ state: ['running'], metadata: { run: process.env.RUN } })
    expect(running.length === 1 && running[0].sandboxId === id, `running by metadata: ${JSON.stringify(running)}`)
    const none = await ids({ metadata: { run: 'another' } })
    expect(none.length === 0, `another run's metadata lists ${JSON.stringify(none)}`)
    const paused = await ids({ state: ['paused'] })
    expect(paused.length === 0, `paused lists ${JSON.stringify(paused)}`)
    const before = (await Sandbox.getInfo(id)).endAt
    await Sandbox.setTimeout(id, 3_600_000)
    const after = (await Sandbox.getInfo(id)).endAt
    expect(after - before > 2_000_000, `setTimeout moved endAt from ${before.toISOString()} to ${after.toISOString()}`)
    return { endAt: after }
  },
  async pause() {
    const paused = await Sandbox.pause(id, long)
    expect(paused === true, 'pause returns true')
    const again = await Sandbox.pause(id, long)
    expect(again === false, 'a second pause returns false (already paused)')
    const info = await Sandbox.getInfo(id)
    expect(info.state === 'paused', `state ${info.state}, want paused`)
    const list = await ids({ state: ['paused'], metadata: { run: process.env.RUN } })
    expect(list.length === 1 && list[0].sandboxId === id && list[0].state === 'paused', `paused list ${JSON.stringify(list)}`)
    expect((await ids({ state: ['running'] })).length === 0, 'nothing running while paused')
    return { state: info.state }
  },
  async connect() {
    const sbx = await Sandbox.connect(id, { timeoutMs: 600_000, ...long })
    expect(sbx.sandboxId === id, `connect answered ${sbx.sandboxId}`)
    expect(sbx.envdAccessToken === process.env.TOKEN, 'connect hands out the sandbox\'s envd token')
    const info = await sbx.getInfo()
    expect(info.state === 'running', `state ${info.state} after connect`)
    expect(info.metadata.suite === 'e2b', `metadata after connect ${JSON.stringify(info.metadata)}`)
    return { state: info.state }
  },
  async refusals() {
    await notFound(() => Sandbox.getInfo('nosuchsandbox'), 'getInfo of an unknown id')
    expect((await Sandbox.kill('nosuchsandbox')) === false, 'kill of an unknown id returns false')
    try {
      await Sandbox.list({ apiKey: 'bad-key' }).nextItems()
      throw new Error('a bad key listed sandboxes')
    } catch (e) {
      expect(e instanceof AuthenticationError, `bad key: ${e.name}: ${e.message}, want AuthenticationError`)
    }
    const other = { apiKey: process.env.OTHER_KEY }
    await notFound(() => Sandbox.getInfo(id, other), "another namespace's key: getInfo")
    await notFound(() => Sandbox.connect(id, other), "another namespace's key: connect")
    expect((await Sandbox.kill(id, other)) === false, "another namespace's key: kill returns false")
    expect((await Sandbox.list(other).nextItems()).length === 0, "another namespace's key lists nothing")
    try {
      await Sandbox.create('base', { volumeMounts: { '/data': 'vol' } })
      throw new Error('volumes were accepted')
    } catch (e) {
      expect(/volume/i.test(e.message), `volumes refused with ${e.message}`)
    }
    await refused(() => Sandbox.create('base', { allowInternetAccess: false }), 'allowInternetAccess false', /allow_internet_access/)
    await refused(() => Sandbox.create('base', { network: { denyOut: ['0.0.0.0/0'] } }), 'network', /network/)
    await refused(() => Sandbox.updateNetwork(id, { denyOut: ['0.0.0.0/0'] }), 'updateNetwork', /network/)
    await refused(() => Sandbox.create('base', { metadata: { big: 'x'.repeat(600) } }), 'a 600-byte metadata value', /metadata/)
    await refused(() => Sandbox.create('base', { envs: { 'A=B': '1' } }), 'an env var named A=B', /envVars/)
    await refused(() => Sandbox.create('base', { envs: { A: 'x'.repeat(2 << 20) } }), 'a 2 MiB body', /413/)
    await refused(() => Template.getTags('base'), 'Template.getTags', /template builds/)
    await refused(() => Template.build(Template().fromImage('busybox:1'), 'it-template'), 'Template.build', /template builds/)
    await refused(() => Volume.create('it-volume'), 'Volume.create', /volumes/)
    await refused(() => Sandbox.create('nosuchtemplate'), 'an unknown template', /not found/)
    return {}
  },
  // A sandbox created with onTimeout 'pause' is paused by the controller
  // when its timeout passes, and connect brings it back.
  async autopause() {
    const sbx = await Sandbox.create('base', { timeoutMs: 30_000, lifecycle: { onTimeout: 'pause' }, metadata: { run: process.env.RUN }, ...long })
    const info = await sbx.getInfo()
    expect(info.lifecycle?.onTimeout === 'pause', `lifecycle ${JSON.stringify(info.lifecycle)}`)
    const deadline = Date.now() + 240_000
    let state = info.state
    while (state !== 'paused' && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 1000))
      state = (await Sandbox.getInfo(sbx.sandboxId)).state
    }
    expect(state === 'paused', `state ${state} 4 minutes after a 30 s timeout with onTimeout pause`)
    expect((await Sandbox.kill(sbx.sandboxId)) === true, 'kill of the auto-paused sandbox')
    return { id: sbx.sandboxId }
  },
  async kill() {
    expect((await Sandbox.kill(id)) === true, 'kill returns true')
    await notFound(() => Sandbox.getInfo(id), 'getInfo after kill')
    return {}
  },
}

try {
  const out = await steps[step]()
  console.log(JSON.stringify(out))
} catch (e) {
  console.error(`${step}: ${e.stack || e}`)
  process.exit(1)
}
