// An agent's session written against E2B's SDK, unchanged for cryo: only
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point it at the cluster
// (hack/demo-e2b.sh sets them). It creates a sandbox, writes its state to
// a file and starts a long-running counter, pauses, resumes, reads the
// state back (the counter went on from where it was), then forks the
// sandbox into two that continue on their own; it prints what each step
// took.
import { createRequire } from 'node:module'
import { join } from 'node:path'

// The SDK is installed in the tools cache (hack/tools.sh e2b-sdk).
const require = createRequire(join(process.env.E2B_SDK_DIR, 'node_modules', 'x.js'))
const { Sandbox } = require('e2b')

// QEMU without KVM is slow: allow minutes where E2B needs seconds.
const slow = { requestTimeoutMs: 300_000 }
const times = []
const bold = (s) => `\x1b[1m${s}\x1b[0m`
const dim = (s) => `\x1b[2m${s}\x1b[0m`

async function step(what, fn) {
  process.stdout.write(`${bold('>')} ${what} ... `)
  const t0 = performance.now()
  const out = await fn()
  const ms = performance.now() - t0
  times.push([what, ms])
  const shown = typeof out === 'string' ? out : out?.sandboxId
  console.log(`${(ms / 1000).toFixed(2)} s${shown === undefined ? '' : '  ' + dim(shown)}`)
  return out
}

const counter = async (sbx) => (await sbx.commands.run('cat /home/user/counter')).stdout.trim()

let sbx
try {
  sbx = await step('Sandbox.create("base")', async () => Sandbox.create('base', { timeoutMs: 3_600_000, metadata: { demo: 'agent' }, ...slow }))
  await step('first command (commands.run: uname -a)', async () => (await sbx.commands.run('uname -a')).stdout.trim())
  const plan = '# plan\n1. read the repo\n2. write the fix\n3. run the tests\n'
  await step('files.write /home/user/plan.md', async () => {
    await sbx.files.write('/home/user/plan.md', plan)
    await sbx.files.write('/home/user/progress', 'step 1 done\n')
  })
  const bg = await step('start a background counter (commands.run, background)', async () =>
    sbx.commands.run('i=0; while :; do i=$((i+1)); echo $i > /home/user/counter; sleep 1; done', { background: true }))
  await bg.disconnect()
  await new Promise((r) => setTimeout(r, 3000))
  const before = await counter(sbx)
  console.log(dim(`  counter before the pause: ${before} (pid ${bg.pid})`))

  await step('pause (sandbox.pause: a Checkpoint, the pod gone)', async () => { await sbx.pause(slow) })
  await step('Sandbox.list({state: paused})', async () => {
    const p = Sandbox.list({ query: { state: ['paused'], metadata: { demo: 'agent' } } })
    return (await p.nextItems()).map((s) => `${s.sandboxId} ${s.state}`).join(', ')
  })
  await new Promise((r) => setTimeout(r, 3000))

  sbx = await step('resume (Sandbox.connect of the paused sandbox)', async () => Sandbox.connect(sbx.sandboxId, slow))
  const after = await step('first command after resume (cat counter)', async () => counter(sbx))
  await step('files.read /home/user/plan.md', async () => {
    const got = await sbx.files.read('/home/user/plan.md')
    if (got !== plan) throw new Error(`plan.md after resume: ${JSON.stringify(got)}`)
    return 'the same plan'
  })
  console.log(dim(`  counter: ${before} before the pause, ${after} after: the process went on (a pause freezes it, no restart)`))
  const running = await sbx.commands.list()
  console.log(dim(`  processes: ${running.map((p) => `${p.pid} ${p.cmd}`).join('; ')}`))

  const forks = await step('fork into 2 (Sandbox.fork, count 2)', async () => {
    const fs = await Sandbox.fork(sbx.sandboxId, { count: 2, timeoutMs: 3_600_000, ...slow })
    for (const f of fs) if (!(f instanceof Sandbox)) throw f
    return fs
  })
  await step('each fork takes its own path', async () => {
    await Promise.all(forks.map((f, i) => f.files.write('/home/user/progress', `step 2 done, approach ${'AB'[i]}\n`)))
    const seen = await Promise.all([sbx, ...forks].map(async (s) => `${s.sandboxId}: ${(await s.files.read('/home/user/progress')).trim()} (counter ${await counter(s)})`))
    return '\n    ' + seen.join('\n    ')
  })
  await step('kill the forks and the sandbox', async () => {
    for (const s of [...forks, sbx]) await s.kill()
  })

  console.log(bold('\nwhat each step took'))
  for (const [what, ms] of times) console.log(`  ${(ms / 1000).toFixed(2).padStart(8)} s  ${what}`)
  process.exit(0)
} catch (e) {
  console.error(`\ndemo-e2b: ${e.stack || e}`)
  if (sbx?.sandboxId) await Sandbox.kill(sbx.sandboxId).catch(() => {})
  process.exit(1)
}
